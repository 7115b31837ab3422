"""What every process group is: the interface (:class:`ProcessGroup`, which is
also the group of one), its error, its timeout, and how a rank that fails
ends the job.  The backends (``handlers.mpi_group``, ``handlers.cuda.nccl``)
build on this module and ``handlers.process_group`` chooses among them; none
of them imports another (see ``handlers.process_group`` for the story).
"""
import contextlib
import faulthandler
import math
import os
import sys
import time

#: The groups made so far, by kind ("one", "mpi" or "nccl"): the cache of
#: ``handlers.process_group.process_group``, which ``ProcessGroup.close`` empties.
groups_made = {}
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
        for key, group in list(groups_made.items()):
            if group is self:
                del groups_made[key]


def _difference(a, b):
    """Where ``b`` first differs from ``a``, in words (both usually lists)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"item {i} is {x!r} on rank 0 but {y!r} there"
        return f"rank 0 has {len(a)} items, that rank {len(b)}"
    return f"{a!r} on rank 0, {b!r} there"


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
