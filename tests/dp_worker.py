"""One rank of the data-parallel tests: ``mpiexec -n 2 python tests/dp_worker.py
SCENARIO OUTDIR [CASE ...]`` (see tests/test_data_parallel.py).

Scenarios:

* ``train``: train each CASE (``CASES`` names them) data-parallel on
  NumpyHandler (MPI) and save every rank's final parameters and step losses
  to ``OUTDIR/<case>-rank<r>.npz``; ``train-gpu`` the same on PyCudaHandler
  (NCCL, one GPU per rank);
* ``raise``: rank 1 raises before its third step (an exception nothing catches);
* ``hang``: rank 1 stops taking part (sleeps) before its third step;
* ``die``: rank 1 is killed (SIGKILL) before its third step;
* ``late``: rank 1 never starts MPI, so rank 0 waits in the group's start
  (rank 1 waits for rank 0 to end and prints how long it lived: see ``late``);
* ``layout``: rank 1 builds a network one unit wider than rank 0's;
* ``hang-gpu`` (and the others with ``-gpu``): the same on PyCudaHandler;
* ``resume-run``: for each RESUME_CASE (``RESUME_CASES``), the run of
  ``RESUME_EPOCHS`` epochs uninterrupted (every rank's final
  ``trainer.state_dict()`` to ``OUTDIR/<case>-full-rank<r>.safetensors``), then
  the same run stopped after ``RESUME_STOP`` epochs and saved
  (``trainer.save``, every rank calling it) to ``OUTDIR/<case>.safetensors``;
* ``resume-continue``: in a new job, every rank builds each case afresh, loads
  that file and fits to ``RESUME_EPOCHS`` (final states to
  ``OUTDIR/<case>-resumed-rank<r>.safetensors``); and, the negative control,
  once more with every rank given rank 0's saved random state
  (``...-rank0-random-rank<r>.safetensors``).

The test module imports ``problem`` and ``train`` to train the same cases in
one process, the reference.
"""
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

from handlers import NumpyHandler  # noqa: E402
from layers import (  # noqa: E402
    LSTM,
    SGD,
    Adam,
    Dropout,
    FullyConnected,
    Residual,
    Sequential,
    SoftmaxCrossEntropy,
    Tanh,
    Trainer,
    checkpoint,
)
from layers.data_parallel import DataParallel  # noqa: E402

#: case -> (model, dtype, options): small enough that a case takes a moment
CASES = {
    # 70 samples in batches of 16: uneven last batch (6), shards of 8 and 8, 3 and 3
    "mlp-f64": ("mlp", np.float64, dict(batch_size=16, n=70)),
    "mlp-f32": ("mlp", np.float32, dict(batch_size=16, n=70)),
    # one bucket per layer (tiny buckets), Adam, a captured step
    "mlp-f64-buckets-graph": ("mlp", np.float64, dict(batch_size=16, n=70, bucket_bytes=8,
                                                      graph=True, optimizer="adam")),
    # batches of 5 (shards 2 and 3), 11 samples: the last batch of 1 leaves rank 0 empty
    "mlp-f64-tiny": ("mlp", np.float64, dict(batch_size=5, n=11)),
    # each rank's trainer seeded differently: rank 0's shuffling must win
    "mlp-f64-rank-seeds": ("mlp", np.float64, dict(batch_size=16, n=70, rank_seeds=True)),
    # a residual block: its layers' parameters are one top-level layer's bucket
    "residual-f64-buckets-graph": ("residual", np.float64, dict(batch_size=16, n=70,
                                                                bucket_bytes=8, graph=True)),
    "lstm-f64": ("lstm", np.float64, dict(batch_size=8, n=37, bucket_bytes=64)),
    "lstm-f32": ("lstm", np.float32, dict(batch_size=8, n=37)),
    # bfloat16 compute, float32 master: the all-reduces start after backward's cast
    "mlp-bf16-mixed": ("mlp", np.float32, dict(batch_size=16, n=70, precision="bf16")),
    # float16 compute with dynamic loss scaling: the overflow flags are combined
    "mlp-f16-mixed": ("mlp", np.float32, dict(batch_size=16, n=70, precision="fp16")),
}
EPOCHS = 3


def problem(model, n, seed=1):
    """(x, y, batch_axis) of a small classification problem for ``model``."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    if model in ("mlp", "residual"):
        centers = rng.normal(0.0, 1.0, (3, 6))
        return centers[labels] + rng.normal(0.0, 0.7, (n, 6)), labels, 0
    centers = rng.normal(0.0, 1.0, (3, 1, 4))
    x = centers[labels].transpose(1, 0, 2) + rng.normal(0.0, 0.7, (5, n, 4))   # (T, n, F)
    return x, labels, 1


def network(model, h, wider=0):
    """The case's network on handler ``h`` (``wider`` more hidden units)."""
    if model == "mlp":
        layers = [FullyConnected(6, 16 + wider), Tanh(), FullyConnected(16 + wider, 12),
                  Tanh(), FullyConnected(12, 3)]
    elif model == "residual":
        layers = [FullyConnected(6, 16 + wider), Tanh(),
                  Residual([FullyConnected(16 + wider, 16 + wider), Tanh(),
                            FullyConnected(16 + wider, 16 + wider)]),
                  Tanh(), FullyConnected(16 + wider, 3)]
    else:
        layers = [LSTM(4, 8 + wider, return_sequences=False), FullyConnected(8 + wider, 3)]
    return Sequential(h, layers, SoftmaxCrossEntropy(), seed=3)


def handler(dtype, gpu, seed=None):
    """The case's handler: NumpyHandler, or with ``gpu`` a PyCudaHandler on
    this rank's device; five stream groups (the all-reduces take the last)."""
    if not gpu:
        return NumpyHandler(dtype, seed=seed, num_stream_groups=5)
    from handlers import PyCudaHandler
    from handlers.process_group import process_group
    return PyCudaHandler(dtype, seed=seed, device=process_group().local_rank,
                         num_stream_groups=5)


def train(case, data_parallel, gpu=False):
    """Train ``case``; returns (final parameters, step losses) on the host.
    The trainer captures its step where the handler prefers it (the GPU)."""
    model, dtype, opts = CASES[case]
    x, y, axis = problem(model, opts["n"])
    h = handler(dtype, gpu)
    net = network(model, h)
    opt = Adam(net.parameters, lr=0.01) if opts.get("optimizer") == "adam" \
        else SGD(net.parameters, lr=0.2, momentum=0.5)
    dp = data_parallel
    if opts.get("precision"):
        net.mixed_precision(opts["precision"])   # before DataParallel, which follows it
    if data_parallel and "bucket_bytes" in opts:
        dp = DataParallel(net, bucket_bytes=opts["bucket_bytes"])
    # The reference (one process) and rank 0 shuffle with seed 7; with
    # rank_seeds the other ranks are given other seeds, which must not matter.
    seed = 7 + 1000 * rank() if data_parallel and opts.get("rank_seeds") else 7
    trainer = Trainer(net, opt, batch_size=opts["batch_size"], batch_axis=axis, seed=seed,
                      progress=False, graph=opts.get("graph"),
                      precision=opts.get("precision"), data_parallel=dp)
    history = trainer.fit(x, y, EPOCHS)
    return h.get_numpy_copy(net.params), np.array(history.step_losses)


def rank():
    from handlers.process_group import process_group
    return process_group().rank


#: resume case -> (dtype, options): a network with dropout on handlers seeded
#: per rank (so each rank's random state is its own), 70 samples in batches of 16
RESUME_CASES = {
    "resume-sgd-f64": (np.float64, {}),
    "resume-adam-f32-graph": (np.float32, dict(optimizer="adam", graph=True)),
    "resume-sgd-bf16": (np.float32, dict(precision="bf16")),
}
RESUME_EPOCHS, RESUME_STOP, RESUME_INIT_SEED = 4, 2, 3


def resume_network(h, init_seed=RESUME_INIT_SEED):
    """The resume cases' network: FullyConnected -> Tanh -> Dropout ->
    FullyConnected, initialized from ``init_seed``."""
    return Sequential(h, [FullyConnected(6, 16), Tanh(), Dropout(0.2), FullyConnected(16, 3)],
                      SoftmaxCrossEntropy(), seed=init_seed)


def resume_trainer(case, init_seed=RESUME_INIT_SEED, gpu=False):
    """A fresh data-parallel run of resume ``case`` on this rank: its handler
    (NumpyHandler, or PyCudaHandler with ``gpu``) seeded ``100 + rank``,
    ``resume_network`` initialized from ``init_seed`` (rank 0's parameters
    are broadcast to the others)."""
    dtype, opts = RESUME_CASES[case]
    net = resume_network(handler(dtype, gpu, seed=100 + rank()), init_seed)
    opt = Adam(net.parameters, lr=0.01) if opts.get("optimizer") == "adam" \
        else SGD(net.parameters, lr=0.1, momentum=0.9)
    return Trainer(net, opt, batch_size=16, seed=7, progress=False, graph=opts.get("graph"),
                   precision=opts.get("precision"), data_parallel=True)


def resume(scenario, out, cases, gpu=False):
    """The ``resume-run`` and ``resume-continue`` scenarios (see the module
    docstring), on PyCudaHandler with ``gpu``."""
    x, y, _ = problem("mlp", 70)
    me = rank()
    for case in cases:
        if scenario == "resume-run":
            trainer = resume_trainer(case, gpu=gpu)
            trainer.fit(x, y, RESUME_EPOCHS)
            state = trainer.state_dict()              # a collective: every rank
            checkpoint.save(out / f"{case}-full-rank{me}.safetensors", state)
            trainer = resume_trainer(case, gpu=gpu)
            trainer.fit(x, y, RESUME_STOP)
            trainer.save(out / f"{case}.safetensors")
            continue
        for control in (False, True):
            trainer = resume_trainer(case, init_seed=99, gpu=gpu)
            trainer.load(out / f"{case}.safetensors")
            if control:      # rank 0's random state on every rank: dropout's masks change
                saved = checkpoint.load(out / f"{case}.safetensors")["trainer.random"][0]
                trainer.net.parameters.h.set_random_state(saved)
            trainer.fit(x, y, RESUME_EPOCHS)
            state = trainer.state_dict()
            name = "rank0-random" if control else "resumed"
            checkpoint.save(out / f"{case}-{name}-rank{me}.safetensors", state)


def late(out, launcher_rank, limit=50):
    """The ``late`` scenario before MPI starts: rank 0 notes its process id
    and start time in ``out`` and goes on (to wait in ``process_group()``);
    rank 1 never starts MPI.  It waits for rank 0's process to end, prints
    how long it lived and exits, so that the test sees rank 0's own time even
    where the launcher does not end the job when rank 0 exits (mpich's once
    left rank 1 asleep past the test's minute)."""
    note = out / "late-rank0.txt"
    if launcher_rank != "1":
        note.write_text(f"{os.getpid()} {time.time()}")
        return
    begin = time.time()
    while not note.exists() and time.time() - begin < limit:
        time.sleep(0.05)
    pid, start = note.read_text().split() if note.exists() else ("0", begin)
    while time.time() - begin < limit and _alive(int(pid)):
        time.sleep(0.05)
    print(f"late: rank 0 ended {time.time() - float(start):.1f} s after it started", flush=True)
    os._exit(3)


def _alive(pid):
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped by
    the launcher, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:   # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def main(argv):
    scenario, out = argv[0], Path(argv[1])
    if scenario in ("train", "train-gpu"):
        for case in argv[2:]:
            params, losses = train(case, True, gpu=scenario == "train-gpu")
            np.savez(out / f"{case}-rank{rank()}.npz", params=params, losses=losses)
        return
    if scenario.removesuffix("-gpu") in ("resume-run", "resume-continue"):
        resume(scenario.removesuffix("-gpu"), out, argv[2:], gpu=scenario.endswith("-gpu"))
        return
    gpu = scenario.endswith("-gpu")        # a fault scenario on GPUs (NCCL)
    scenario = scenario.removesuffix("-gpu")
    if scenario == "late":
        late(out, os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")))
    me = rank()
    if scenario == "layout":
        h = NumpyHandler(np.float64)
        net = network("mlp", h, wider=me)
        Trainer(net, SGD(net.parameters), progress=False, data_parallel=True)
        return
    calls = [0]
    begin = DataParallel.set_batch

    def set_batch(self, n):   # rank 1 stops before its third step
        calls[0] += 1
        if me == 1 and calls[0] == 3:
            if scenario == "raise":
                raise RuntimeError("rank 1 fails on purpose")
            if scenario == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)            # hangs: only rank 0's timeout ends the job
        begin(self, n)

    if scenario != "late":
        DataParallel.set_batch = set_batch
    train("mlp-f64", True, gpu=gpu)


if __name__ == "__main__":
    main(sys.argv[1:])
