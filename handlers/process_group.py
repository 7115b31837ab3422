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
import importlib.util
import os

from .group import (  # noqa: F401 - the interface, re-exported: its users import it here
    DEFAULT_TIMEOUT,
    CollectiveTimeoutError,
    ProcessGroup,
    groups_made,
    timeout_from,
)

#: Environment variables in which MPI launchers announce the number of
#: processes (Open MPI, MPICH's and Intel MPI's Hydra, MVAPICH).
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
#: Variables that show a launcher started this process without its size
#: (PMIx under Slurm, say): MPI itself is then asked.
RANK_VARIABLES = ("PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")


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
    # The handler says which backend carries its arrays' collectives.
    backend = getattr(h, "collective_backend", None)
    if backend == "mpi":
        return world
    if backend == "nccl":   # one device per process (the current one): one NCCL group
        from .cuda.nccl import NcclGroup
        return _cached("nccl", lambda: NcclGroup(world, seconds), seconds, timeout)
    raise TypeError(f"process_group: {type(h).__name__} has no collective backend "
                    f"(collective_backend {backend!r}); several processes need a "
                    f"NumpyHandler (MPI) or a PyCudaHandler (NCCL)")


def _cached(key, make, seconds, asked):
    """The group cached under ``key``, made by ``make()`` the first time; an
    explicit timeout (``asked`` not None) is applied to it."""
    group = groups_made.get(key)
    if group is None:
        group = groups_made[key] = make()
    elif asked is not None:
        group.timeout = seconds
    return group
