"""``MpiGroup``: a process group whose collectives go through MPI (mpi4py).

It carries NumpyHandler's array collectives and every group's host
collectives (the NCCL group bootstraps and checks through it).  Array
collectives are MPI's nonblocking ones (``Iallreduce``, ``Ibcast``), so an
all-reduce started while backward still runs moves on while the host
computes, and every wait polls with a deadline instead of blocking inside
MPI: a rank that stopped taking part makes the others raise
``CollectiveTimeoutError`` after ``timeout`` seconds rather than hang.

Imported only when an MPI launcher started several processes
(``handlers.process_group.process_group``): importing ``mpi4py.MPI``
initialises MPI.
"""
import pickle
import time

import numpy as np

from .checks import check_arrays
from .graphs import issue_work
from .group import (
    CollectiveTimeoutError,
    ProcessGroup,
    abort_on_uncaught,
    exit_unless_done,
    timeout_from,
)

#: Formats MPI sums natively (MPI has no 16-bit floating-point type).
SUMMABLE = ("float32", "float64")
#: Seconds a wait polls without sleeping: healthy collectives mostly finish
#: within it, and sleeping would add its granularity to every step.
SPIN_SECONDS = 2e-3
#: The longest sleep between two polls of a long wait.
MAX_PAUSE = 1e-3


class MpiGroup(ProcessGroup):
    """The MPI processes of this job (``MPI.COMM_WORLD``, duplicated so its
    collectives never match the program's own MPI calls).  See
    ``ProcessGroup`` for the interface; arrays are NumpyHandler arrays of
    float32 or float64 (TypeError for other formats).

    Args:
        timeout: seconds a wait may take (see ``handlers.process_group``).
    """

    backend = "mpi"

    def __init__(self, timeout=None):
        # Importing mpi4py.MPI starts MPI, which waits for every rank.
        with exit_unless_done(timeout_from(timeout)):
            from mpi4py import MPI
        self._MPI = MPI
        world = MPI.COMM_WORLD
        super().__init__(world.Get_rank(), world.Get_size(), timeout=timeout)
        self._pending = []    # requests of the all-reduces started and not yet completed
        self._pending_elements = 0
        self._broken = None   # the CollectiveTimeoutError that ended the group, if any
        if self.size > 1:
            abort_on_uncaught(lambda: world.Abort(1), self.rank, self.size)
        # Split_type and Dup block inside MPI: wait, with the deadline, until
        # every rank has come this far, so that they cannot hang.
        self.wait([world.Ibarrier()], "every rank to create its process group")
        local = world.Split_type(MPI.COMM_TYPE_SHARED)   # the processes on this machine
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        local.Free()
        self._comm = world.Dup()

    # ---------------------------------------------------------------- waiting
    def wait(self, requests, op):
        """Wait for the MPI ``requests`` to complete, polling, at most
        ``timeout`` seconds; raise ``CollectiveTimeoutError`` naming ``op``
        after that (and on every later call: the group is then unusable)."""
        self._usable()
        test = self._MPI.Request.Testall
        if not requests or test(requests):
            return
        start = time.monotonic()
        pause = 0.0
        while not test(requests):
            waited = time.monotonic() - start
            if waited > self.timeout:
                self._broken = CollectiveTimeoutError(
                    f"streamhandlers: rank {self.rank} of {self.size} waited {self.timeout:g} s "
                    f"for {op} and gave up: another rank failed, hung or left the job (its own "
                    f"output says which); the limit is the process group's timeout "
                    f"(STREAMHANDLERS_TIMEOUT)", op, self.rank, self.size, self.timeout)
                raise self._broken
            if waited > SPIN_SECONDS:
                pause = min(MAX_PAUSE, 2 * pause + 1e-5)
                time.sleep(pause)

    def _usable(self):
        if self._broken is not None:
            raise self._broken

    def _check(self, h, op, a):
        check_arrays(h, op, a)
        if h.dtype.name not in SUMMABLE:
            raise TypeError(f"{op}: MPI has no {h.dtype.name} sum; collectives of a "
                            f"NumpyHandler take float32 or float64 arrays (keep the master "
                            f"parameters in float32: Trainer(precision='bf16'))")

    # ---------------------------------------------------------- array collectives
    def allreduce(self, h, a):
        self._check(h, "allreduce", a)
        if self.size > 1 and a.size:
            issue_work(h, "allreduce", self._start_allreduce, a)

    def _start_allreduce(self, a):
        self._usable()
        MPI = self._MPI
        self._pending.append(self._comm.Iallreduce(MPI.IN_PLACE, a, op=MPI.SUM))
        self._pending_elements += a.size
        # MPICH moves a nonblocking collective on only inside MPI calls: a
        # test here lets the earlier buckets progress while backward runs.
        MPI.Request.Testall(self._pending)

    def complete(self, h):
        if self.size > 1:
            issue_work(h, "complete", self._complete)

    def _complete(self):
        pending, n = self._pending, self._pending_elements
        self._pending, self._pending_elements = [], 0
        self.wait(pending, f"{len(pending)} all-reduce{'s' if len(pending) != 1 else ''} "
                           f"({n} elements in all)")

    def broadcast(self, h, a, root=0):
        self._check(h, "broadcast", a)
        if self.size > 1 and a.size:
            issue_work(h, "broadcast", self._broadcast, a, root)

    def _broadcast(self, a, root):
        self._usable()
        self.wait([self._comm.Ibcast(a, root=root)],
                  f"the broadcast of {a.size} elements from rank {root}")

    # ----------------------------------------------------------- host collectives
    def allgather_object(self, obj):
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        counts = np.empty(self.size, np.int64)
        self.wait([self._comm.Iallgather(np.array([data.size], np.int64), counts)],
                  "an allgather of sizes")
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out = np.empty(int(counts.sum()), np.uint8)
        self.wait([self._comm.Iallgatherv(data, [out, counts, displs, self._MPI.BYTE])],
                  "an allgather")
        return [pickle.loads(out[d:d + c].tobytes()) for d, c in zip(displs, counts)]

    def broadcast_object(self, obj, root=0):
        data = np.frombuffer(pickle.dumps(obj), np.uint8) if self.rank == root else None
        n = np.array([0 if data is None else data.size], np.int64)
        self.wait([self._comm.Ibcast(n, root=root)], f"a broadcast from rank {root}")
        buf = data.copy() if data is not None else np.empty(int(n[0]), np.uint8)
        self.wait([self._comm.Ibcast(buf, root=root)], f"a broadcast from rank {root}")
        return pickle.loads(buf.tobytes())

    def close(self):
        if self._comm is not None and not self._MPI.Is_finalized():
            self._comm.Free()
        self._comm = None
        super().close()
