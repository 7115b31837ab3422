"""Process groups: the processes that train one model together.

One process per device, started by an MPI launcher (``mpirun -n 4 python
train.py``, on one machine or several); each process holds a handler, and its
process group carries the collectives between them.  ``process_group(h)``
returns the group for handler ``h``:

* a **group of one** where no MPI launcher started this process, or it
  started one process.  Its collectives do nothing, and mpi4py is not even
  imported, so every script runs unchanged on one machine;
* :class:`handlers.mpi_group.MpiGroup` for a NumpyHandler: collectives
  through MPI itself (``mpi4py``), nonblocking;
* :class:`handlers.cuda.nccl.NcclGroup` for a PyCudaHandler: collectives on
  device arrays through NCCL (``nccl4py``) on the handler's streams, the
  communicator bootstrapped by broadcasting NCCL's unique id over MPI.

Every group has the interface of :class:`ProcessGroup`.  Collectives on
arrays are issued like ops, on the stream group of the handler (or view)
they are given, and a capture records them (``Handler.capture``), so a
data-parallel step can be captured and replayed whole.

Faults.  Creating a group of more than one process makes an exception that
nothing catches end the whole job (an ``MPI Abort`` after the traceback), so
the other ranks do not wait for a rank that has stopped.  Every wait of a
collective has a deadline (``timeout`` seconds, default 300, or the
``STREAMHANDLERS_TIMEOUT`` environment variable): a rank that hung or left
makes the others raise :class:`CollectiveTimeoutError` through MPI, naming
the operation and the ranks, within that time instead of hanging (on GPUs,
whose host blocks on the device, a watchdog ends the job instead: see
:mod:`handlers.cuda.nccl`).  Starting MPI waits for every rank and holds the
interpreter meanwhile, so a rank that never starts makes the others end
after the timeout through ``faulthandler``, which prints where they waited.
A rank that dies outright is seen first by the launcher, which ends the job.
"""
import contextlib
import faulthandler
import importlib.util
import math
import os
import sys
import time

#: Environment variables in which MPI launchers announce the number of
#: processes (Open MPI, MPICH's and Intel MPI's Hydra, MVAPICH).
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
#: Variables that show a launcher started this process without its size
#: (PMIx under Slurm, say): MPI itself is then asked.
RANK_VARIABLES = ("PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
#: Seconds a collective may take before ranks that wait for it give up.
DEFAULT_TIMEOUT = 300.0
#: Seconds between an uncaught exception's traceback and the job's abort.
ABORT_GRACE = 0.5


class CollectiveTimeoutError(TimeoutError):
    """A collective did not complete within the group's timeout: another rank
    failed, hung or left the job.

    Attributes: ``op`` (what was waited for), ``rank``, ``size`` and
    ``timeout`` (seconds).  The group cannot be used afterwards (its
    collectives may still be in flight): its later calls raise this again.
    """

    def __init__(self, message, op, rank, size, timeout):
        super().__init__(message)
        self.op, self.rank, self.size, self.timeout = op, rank, size, timeout


def timeout_from(value):
    """``value`` checked as a timeout in seconds (a positive number), or,
    when None, the ``STREAMHANDLERS_TIMEOUT`` environment variable or
    ``DEFAULT_TIMEOUT``; ValueError otherwise."""
    where = "timeout"
    if value is None:
        value = os.environ.get("STREAMHANDLERS_TIMEOUT", DEFAULT_TIMEOUT)
        where = "STREAMHANDLERS_TIMEOUT" if "STREAMHANDLERS_TIMEOUT" in os.environ else where
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"process_group: {where} must be a positive number of seconds, "
                         f"got {value!r}")
    return seconds


class ProcessGroup:
    """The processes that train together, and the collectives between them.

    This class is the interface and the group of one (``size`` 1), whose
    collectives leave every array as it is.  Backends: ``MpiGroup``
    (NumpyHandler) and ``NcclGroup`` (PyCudaHandler).

    Attributes:
        rank: this process's rank, in ``range(size)``.
        size: the number of processes.
        local_rank: this process's rank among those on its machine; choose
            the device by it (``PyCudaHandler(device=g.local_rank)``).
        local_size: the number of processes on this machine.
        timeout: seconds a collective may take before a waiting rank raises
            ``CollectiveTimeoutError`` (see the module docstring).
        backend: ``"none"``, ``"mpi"`` or ``"nccl"``.
    """

    backend = "none"

    def __init__(self, rank=0, size=1, local_rank=0, local_size=1, timeout=None):
        self.rank, self.size = int(rank), int(size)
        self.local_rank, self.local_size = int(local_rank), int(local_size)
        self.timeout = timeout_from(timeout)

    def __repr__(self):
        return (f"{type(self).__name__}(rank={self.rank}, size={self.size}, "
                f"local_rank={self.local_rank}, backend={self.backend!r})")

    # ---------------------------------------------------------- array collectives
    def allreduce(self, h, a):
        """Start summing ``a`` (an array of handler ``h``) over all ranks, in
        place; returns without waiting.

        The sum is issued on ``h``'s stream group, after the work issued
        there so far; call ``complete(h)`` before reading ``a``.  Every rank
        must start the same all-reduces, of the same sizes, in the same
        order.  Inside a capture it is recorded and runs on every replay.
        """

    def complete(self, h):
        """Make the work issued later on ``h``'s stream group see the results
        of every all-reduce started on it.  On a GPU this only orders the
        stream (the host does not wait); through MPI the host waits, up to
        ``timeout`` seconds (``CollectiveTimeoutError``)."""

    def broadcast(self, h, a, root=0):
        """Overwrite ``a`` (an array of ``h``) on every rank with its value on
        rank ``root``.  Later work on ``h``'s stream group sees the result."""

    # ----------------------------------------------------------- host collectives
    def allgather_object(self, obj):
        """The list of every rank's ``obj`` (any picklable value), in rank
        order; all ranks get the same list."""
        return [obj]

    def broadcast_object(self, obj, root=0):
        """Rank ``root``'s ``obj`` (picklable), returned on every rank."""
        return obj

    def agree(self, what, value):
        """Check that every rank holds the same ``value`` (picklable, compared
        with ``==``); raise ValueError on every rank otherwise, naming the
        first rank whose ``what`` differs from rank 0's and both values."""
        values = self.allgather_object(value)
        for r, v in enumerate(values):
            if v != values[0]:
                raise ValueError(f"process group of {self.size}: rank {r}'s {what} differs "
                                 f"from rank 0's: {_difference(values[0], v)}; every rank "
                                 f"must build the same model and pass the same settings")

    # ----------------------------------------------------------------- life
    def step_issued(self, h):
        """Note that a training step's work was issued on ``h``'s stream
        group (a GPU group's watchdog then checks that it finishes)."""

    def close(self):
        """Release the group's resources (a collective: every rank calls it);
        ``process_group`` then makes a new group."""
        for key, group in list(_groups.items()):
            if group is self:
                del _groups[key]


def _difference(a, b):
    """Where ``b`` first differs from ``a``, in words (both usually lists)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"item {i} is {x!r} on rank 0 but {y!r} there"
        return f"rank 0 has {len(a)} items, that rank {len(b)}"
    return f"{a!r} on rank 0, {b!r} there"


def launched_size():
    """How many processes the MPI launcher started, from the environment it
    sets: None when no launcher started this process, 0 when one did
    without saying how many (MPI itself must then be asked)."""
    for name in SIZE_VARIABLES:
        value = os.environ.get(name)
        if value:
            try:
                return int(value)
            except ValueError:
                return 0
    if any(os.environ.get(name) for name in RANK_VARIABLES):
        return 0
    return None


_groups = {}   # "one", "mpi" or "nccl": the groups made so far


def process_group(h=None, timeout=None):
    """The process group of this process for handler ``h`` (see the module
    docstring); ``h`` None gives the group for host collectives only (an
    ``MpiGroup``, or the group of one).

    Made once per process and cached; a ``timeout`` given
    here becomes the group's.  Raises ImportError, naming what to install,
    when a launcher started several processes but mpi4py (or, for a GPU
    handler, nccl4py) is missing, and TypeError for a handler that has no
    collective backend.
    """
    seconds = timeout_from(timeout)
    size = launched_size()
    if size is None or size == 1:
        return _cached("one", lambda: ProcessGroup(timeout=seconds), seconds, timeout)
    if importlib.util.find_spec("mpi4py") is None:
        raise ImportError(f"process_group: this process was started by an MPI launcher "
                          f"({size or 'several'} processes) but mpi4py is not installed; "
                          f"pip install mpi4py (and mpich, or use the system's MPI)")
    from .mpi_group import MpiGroup
    world = _cached("mpi", lambda: MpiGroup(seconds), seconds, timeout)
    if world.size == 1:
        return _cached("one", lambda: ProcessGroup(timeout=seconds), seconds, timeout)
    if h is None:
        return world
    # (a stream-group view is an instance of its handler's class)
    from .numpy_handler import NumpyHandler
    if isinstance(h, NumpyHandler):
        return world
    cuda = sys.modules.get("handlers.cuda.handler")   # loaded if h can be a PyCudaHandler
    if cuda is not None and isinstance(h, cuda.PyCudaHandler):
        # One device per process (the current one), so one NCCL group.
        from .cuda.nccl import NcclGroup
        return _cached("nccl", lambda: NcclGroup(world, seconds), seconds, timeout)
    raise TypeError(f"process_group: {type(h).__name__} has no collective backend; "
                    f"several processes need a NumpyHandler (MPI) or a PyCudaHandler (NCCL)")


def _cached(key, make, seconds, asked):
    """The group cached under ``key``, made by ``make()`` the first time; an
    explicit timeout (``asked`` not None) is applied to it."""
    group = _groups.get(key)
    if group is None:
        group = _groups[key] = make()
    elif asked is not None:
        group.timeout = seconds
    return group


@contextlib.contextmanager
def exit_unless_done(seconds):
    """Guard a call that blocks inside a library with no deadline of its own
    and holds the interpreter meanwhile (``MPI_Init``, which waits for every
    rank): if the block has not finished within ``seconds``, Python's
    ``faulthandler`` (a thread of its own in C, which needs no interpreter)
    prints every thread's stack, the guarded call on top, and ends this
    process; the launcher then ends the job.  It replaces a
    ``faulthandler.dump_traceback_later`` armed before."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=2)   # fd 2: stderr
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def abort_on_uncaught(abort, rank, size):
    """Make an exception that nothing catches end the whole job: after the
    usual traceback, print why and call ``abort()`` (``MPI Abort``), so the
    other ranks do not wait for this one until their timeout.  Installed
    once per process (``sys.excepthook``)."""
    previous = sys.excepthook
    if getattr(previous, "aborts_job", False):
        return

    def hook(kind, value, tb):
        previous(kind, value, tb)
        print(f"streamhandlers: rank {rank} of {size} stopped on {kind.__name__}; aborting "
              f"the job so that the other ranks do not wait for it", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        # The launcher forwards a rank's output through pipes, and the abort
        # kills the job at once: give it a moment to pass the traceback on.
        time.sleep(ABORT_GRACE)
        abort()

    hook.aborts_job = True
    sys.excepthook = hook
