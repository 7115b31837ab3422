"""``NcclGroup``: PyCudaHandler's collectives through NCCL (nccl4py).

Run on two H200s of one machine (tests/test_data_parallel.py's GPU cases and
``python -m benchmarks dp``); not yet across machines.

One process per GPU, started by an MPI launcher.  Rank 0 makes NCCL's unique
id, the ranks' MPI group (``handlers.mpi_group.MpiGroup``) broadcasts it, and
every rank joins the communicator on the device of its handler, whose primary
context is current (choose the device by ``local_rank``).  Host collectives
(the layout check, seeds) go through that MPI group.

Array collectives are queued by NCCL on the stream of the handler view they
are given, after the work issued there, and return at once: ``complete`` has
nothing to wait for, since later work on that stream runs after them, and a
stream capture records them (NCCL calls can be captured), so a data-parallel
step replays as one CUDA graph.  The collectives are nccl4py's bindings of
``ncclAllReduce`` and ``ncclBroadcast`` called with raw addresses: its
``Communicator`` methods resolve a buffer's device through cuda.core, which
on the 2-GPU H200 machine named device 0 for rank 1's arrays on device 1
and refused the call.  Raw addresses also let bfloat16 through, which the
CUDA array interface cannot describe.

Faults.  NCCL kernels whose peer has stopped spin forever, and the host then
blocks at its next synchronize.  A watchdog thread therefore follows the
training steps: ``step_issued`` records an event after each step's work, and
the thread queries the events (through the extension, on the same primary
context).  If none has completed for ``timeout`` seconds while one is
pending, or NCCL reports an asynchronous error, it prints why, aborts the
communicator and ends the job (``MPI Abort``); the blocked host can do
nothing else.  Creating the communicator is guarded the same way.
"""
import atexit
import contextlib
import functools
import importlib.util
import sys
import threading
import time
from collections import deque

from ..checks import check_arrays
from ..graphs import issue_work
from ..group import ProcessGroup
from . import context as cuda_context

#: handler format -> ncclDataType_t (nccl.h)
NCCL_TYPES = {"float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
#: ncclRedOp_t's ncclSum
NCCL_SUM = 0
#: ncclResult_t values the watchdog tells apart: ncclSuccess, ncclInProgress.
NCCL_SUCCESS, NCCL_IN_PROGRESS = 0, 7


def load_nccl():
    """Import ``nccl.core`` (nccl4py); ImportError naming what to install."""
    if importlib.util.find_spec("nccl") is None:
        raise ImportError("NcclGroup: several processes with a PyCudaHandler need nccl4py, "
                          "which is not installed (pip install 'nccl4py[cu13]' or "
                          "'nccl4py[cu12]', matching the CUDA driver)")
    import nccl.core
    return nccl.core


class NcclGroup(ProcessGroup):
    """The GPUs of an MPI job, one per process, joined by one NCCL
    communicator on the device current when it is made (the process's
    PyCudaHandler's).  See ``ProcessGroup`` for the interface; arrays are the
    handler's, in any of its formats.

    Args:
        mpi: the job's ``MpiGroup`` (bootstrap and host collectives).
        timeout: seconds (see ``handlers.process_group``).

    Raises ImportError without nccl4py.
    """

    backend = "nccl"

    def __init__(self, mpi, timeout=None):
        super().__init__(mpi.rank, mpi.size, mpi.local_rank, mpi.local_size, timeout)
        nccl = load_nccl()
        self._nccl, self._mpi = nccl, mpi
        from nccl.bindings import nccl as bindings
        self._bindings = bindings
        uid = mpi.broadcast_object(nccl.get_unique_id().as_bytes if self.rank == 0 else None)
        cuda_context.enter()     # NCCL joins on the device whose context is current
        self.device, _ = cuda_context.held()
        self._comm = None
        self._watchdog = Watchdog(self)
        with self._watchdog.deadline("creating the NCCL communicator"):
            self._comm = nccl.Communicator.init(self.size, self.rank,
                                                nccl.UniqueId.from_bytes(uid))
        # (The communicator's device cannot be asked back: NCCL 2.28's library
        # has no ncclCommQueryProperties.  It is the current context's, above.)
        # Two ranks on one GPU would share its memory and serialize: say so.
        self.agree_devices()

    def agree_devices(self):
        """Raise ValueError on every rank if two ranks of one machine hold
        the same device."""
        import socket
        seen = {}
        for r, key in enumerate(self._mpi.allgather_object((socket.gethostname(),
                                                            self.device))):
            if key in seen:
                raise ValueError(f"NcclGroup: ranks {seen[key]} and {r} both use device "
                                 f"{key[1]} of {key[0]}; give each rank its own GPU: "
                                 f"PyCudaHandler(device=process_group().local_rank)")
            seen[key] = r

    @property
    def communicator(self):
        """The nccl4py ``Communicator`` (for benchmarks and interop)."""
        return self._comm

    def _call(self, h, op, fn, a, arg):
        """Queue NCCL's ``fn`` (all_reduce or broadcast, in place) on ``a``
        (checked) on ``h``'s stream, as ``h``'s work (``issue_work``)."""
        check_arrays(h, op, a)
        if self.size > 1 and a.size:
            ptr = h._span(a)[0]
            cuda_context.enter()
            # nccl4py's own calls pass its Communicator's _comm object likewise
            issue_work(h, op, functools.partial(fn, ptr, ptr, a.size, NCCL_TYPES[h.dtype.name],
                                                arg, self._comm._comm, h.stream.handle))

    # ---------------------------------------------------------- array collectives
    def allreduce(self, h, a):
        self._call(h, "allreduce", self._bindings.all_reduce, a, NCCL_SUM)

    def complete(self, h):
        pass   # stream-ordered: later work on h's stream runs after the all-reduces

    def broadcast(self, h, a, root=0):
        self._call(h, "broadcast", self._bindings.broadcast, a, root)

    # ----------------------------------------------------------- host collectives
    def allgather_object(self, obj):
        return self._mpi.allgather_object(obj)

    def broadcast_object(self, obj, root=0):
        return self._mpi.broadcast_object(obj, root)

    # ----------------------------------------------------------------- life
    def step_issued(self, h):
        self._watchdog.watch(h.stream.handle)

    def close(self):
        self._watchdog.stop()
        if self._comm is not None:
            self._comm.destroy()   # collective across the ranks of a machine
            self._comm = None
        super().close()

    def nccl_error(self):
        """NCCL's asynchronous error as text, or None while there is none."""
        if self._comm is None:
            return None
        result = self._comm.get_async_error()
        if int(result) in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
            return None
        return f"{self._nccl.get_error_string(result)}: {self._comm.get_last_error()}"

    def fail(self, why):
        """End the job from any thread: print ``why`` and NCCL's own report,
        abort the communicator (its kernels stop spinning), then ``MPI
        Abort``.  Called by the watchdog, whose host thread cannot raise into
        a main thread blocked on the device."""
        detail = ""
        with contextlib.suppress(Exception):
            error = self.nccl_error()
            detail = f"; NCCL reports {error}" if error else ""
        print(f"streamhandlers: rank {self.rank} of {self.size}: {why}{detail}; another rank "
              f"failed, hung or left the job (the limit is the process group's timeout, "
              f"STREAMHANDLERS_TIMEOUT); aborting the job", file=sys.stderr, flush=True)
        if self._comm is not None:
            with contextlib.suppress(Exception):
                self._comm.abort()
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)


class Watchdog:
    """A daemon thread that ends the job when the GPU work of a group stops
    progressing (see the module docstring).

    ``watch(stream)`` records an event on a stream (a driver handle);
    ``deadline(op)`` guards a blocking host call.  Its events go through
    the extension (``kernel_loader.events``), which makes the handlers'
    primary context current on the thread at its first call, never through
    pycuda, whose context stack must be empty on a thread that ends.
    """

    def __init__(self, group):
        from . import kernel_loader
        self._ev, self._group = kernel_loader.events(), group
        self._lock = threading.Lock()
        self._pending = deque()    # (event, time recorded), in stream order
        self._free = []            # events to record again
        self._guards = {}          # op -> when it started
        self._progress = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="streamhandlers-nccl-watchdog",
                                        daemon=True)
        self._thread.start()
        # Stopped before the handlers' context is released at exit (atexit
        # runs last registered first): no query of a destroyed event then.
        atexit.register(self.stop)

    def watch(self, stream):
        """Record an event on ``stream``: the work issued there so far must
        finish within the group's timeout of the last progress."""
        with self._lock:
            event = self._free.pop() if self._free else self._ev.new()
            if not self._pending:
                self._progress = time.monotonic()   # an idle spell is not a stall
            self._ev.record(event, int(stream))
            self._pending.append((event, time.monotonic()))

    @contextlib.contextmanager
    def deadline(self, op):
        """Guard the block: if it has not finished within the timeout, end the
        job naming ``op``."""
        with self._lock:
            self._guards[op] = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._guards.pop(op, None)

    def stop(self):
        """Stop the thread (the group is closing)."""
        self._stopped.set()
        self._thread.join(timeout=5.0)

    def _run(self):
        while not self._stopped.wait(min(1.0, self._group.timeout / 10)):
            why = self._poll()
            if why is not None:
                self._group.fail(why)
                return

    def _poll(self):
        """Why the job must end, or None: drop the finished events, then look
        for a stall, an expired guard or an NCCL error."""
        group = self._group
        now = time.monotonic()
        with self._lock:
            while self._pending:
                try:
                    if not self._ev.query(self._pending[0][0]):   # not finished yet
                        break
                except Exception as e:  # noqa: BLE001 - a failed device ends the job
                    return f"the GPU reported an error: {e}"
                self._free.append(self._pending.popleft()[0])
                self._progress = now
            if self._pending and now - max(self._progress, self._pending[0][1]) > group.timeout:
                return (f"the GPU work of a training step has not finished after "
                        f"{group.timeout:g} s (NCCL collectives wait for every rank)")
            for op, start in self._guards.items():
                if now - start > group.timeout:
                    return f"{op} did not finish within {group.timeout:g} s"
        return "NCCL reported an error" if group.nccl_error() else None
