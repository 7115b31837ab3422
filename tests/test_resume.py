"""A run stopped, saved and resumed ends bit for bit where the same run ends
uninterrupted.

The run (``resume_worker.build``): FullyConnected -> ReLU -> Interrupter (an
identity layer that can raise SIGINT) -> Dropout(0.2) -> FullyConnected,
SoftmaxCrossEntropy, 90 samples in batches of 16 (the last batch holds 10),
four epochs; dropout draws from the handler's generator, so its state is part
of what a resume must restore.  A resumed run is built afresh (a new handler
of the same configuration and seed, a network initialized from another seed,
a new optimizer and trainer) and ``load``\\ s the file; its final
``trainer.state_dict()`` (parameters, optimizer state, loss scaler, random
and shuffling states) must equal the uninterrupted run's, every array byte
for byte, and its epochs must record the same losses.

Cases: stops between epochs (``fit(x, y, 2)`` then ``save``) for SGD, Adam
and AdamW, in the network's format and in bfloat16 and float16 mixed
precision, eager and captured; negative controls, each leaving out one part
of the state, which must change the result; a Ctrl-C inside an epoch
(``fit(..., checkpoint=path)`` saves after the step in flight);
``checkpoint_every``; and the phases in separate processes
(``tests/resume_worker.py``), one of them stopped by a real SIGINT sent from
outside at an arbitrary moment.
"""
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import resume_worker as rw
from handlers.testing import make_handler
from helpers import differing
from layers import checkpoint

WORKER = Path(rw.__file__)
ROOT = WORKER.parents[1]
E = rw.EPOCHS
STEPS = math.ceil(rw.SAMPLES / rw.BATCH)
#: seconds one worker process may take
WORKER_LIMIT = 120


# ------------------------------------------------------------------ helpers
def needs_float32(handler, precision):
    """Skip a mixed-precision case on a handler that is not float32 (the
    master format mixed precision is built for)."""
    if precision is not None and handler.dtype != np.float32:
        pytest.skip(f"{precision} mixed precision keeps a float32 master copy; this handler "
                    f"is {handler.dtype}")


def assert_same_state(got, want, prefix=""):
    """Every entry of two state dicts (those starting with ``prefix``)
    equal, arrays bit for bit; the message counts the differing elements."""
    bad = differing(got, want, prefix)
    if not bad:
        return
    lines = []
    for name in bad:
        a, b = got.get(name), want.get(name)
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape:
            n = int(np.count_nonzero(a.astype(np.float64) != b.astype(np.float64)))
            lines.append(f"{name}: {n} of {a.size} elements differ")
        else:
            lines.append(f"{name}: {a!r:.80} != {b!r:.80}")
    pytest.fail("states differ:\n" + "\n".join(lines))


def assert_trained(final, initial):
    """Every parameter moved from its initial value (the run trained)."""
    still = [k for k in initial if not differing({k: final["net." + k]}, {k: initial[k]})]
    assert not still, f"parameters that did not train: {still}"


def records(history):
    """The epochs' records without their timings."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in history.epochs]


def uninterrupted(handler_id, opt, precision, graph):
    """(trainer, history, initial net state) of the whole run, uninterrupted."""
    x, y = rw.problem()
    run = rw.build(handler_id, opt, precision, graph)
    initial = run.net.state_dict()
    history = run.fit(x, y, E)
    assert_trained(run.state_dict(), initial)
    return run, history, initial


def fresh(handler_id, opt, precision, graph):
    """A run to resume into: built afresh, its network initialized from
    another seed, and its biases (initialized to 0) moved, so that the load
    has every parameter to overwrite."""
    run = rw.build(handler_id, opt, precision, graph, init_seed=rw.OTHER_INIT_SEED)
    run.net.load_state_dict({k: v + 0.5 if k.endswith(".b") else v
                             for k, v in run.net.state_dict().items()})
    initial = rw.build(handler_id, opt, precision, graph).net.state_dict()
    assert len(differing(run.net.state_dict(), initial)) == len(initial), \
        "the premise: other initial values"
    return run


# ------------------------------------------------------------------ in process
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("precision", [None, "bf16", "fp16"], ids=["own", "bf16", "fp16"])
@pytest.mark.parametrize("opt", ["sgd", "adam", "adamw"])
def test_resume_between_epochs_is_bit_exact(handler, handler_id, opt, precision, graph,
                                            tmp_path):
    """Two epochs, save, a fresh run loads and trains to four: the same
    state, bit for bit, as four epochs uninterrupted, and the same losses."""
    needs_float32(handler, precision)
    x, y = rw.problem()
    want, want_history, _ = uninterrupted(handler_id, opt, precision, graph)
    first = rw.build(handler_id, opt, precision, graph)
    first_history = first.fit(x, y, 2)
    path = tmp_path / "run.safetensors"
    first.save(path)
    assert differing(first.state_dict(), want.state_dict(), "net."), \
        "the last two epochs must change the parameters"
    run = fresh(handler_id, opt, precision, graph)
    run.load(path)
    assert (run.epoch, run.step) == (2, 0)
    history = run.fit(x, y, E)
    assert len(run._step.captured) == (2 if graph else 0)   # the resumed steps replayed
    assert_same_state(run.state_dict(), want.state_dict())
    assert records(first_history) + records(history) == records(want_history)
    assert first_history.step_losses + history.step_losses == want_history.step_losses


@pytest.mark.parametrize("left_out", ["parameters-only", "velocity", "random", "shuffle"])
def test_a_part_left_out_changes_the_result(handler, handler_id, left_out, tmp_path):
    """Negative controls (SGD with momentum): a resume that restores the
    parameters alone, or all but the velocity, the handler's random state
    (dropout's masks) or the shuffling state, does not end where the
    uninterrupted run does; so the comparison of the other tests can fail."""
    x, y = rw.problem()
    want = uninterrupted(handler_id, "sgd", None, False)[0].state_dict()
    first = rw.build(handler_id, "sgd", None, False)
    first.fit(x, y, 2)
    state = first.state_dict()
    run = fresh(handler_id, "sgd", None, False)
    if left_out == "parameters-only":
        run.net.load_state_dict(checkpoint.subset(state, "net."))
        run.fit(x, y, E - 2)          # the remaining epochs, counted from 0
    else:
        if left_out == "velocity":
            state = {k: np.zeros_like(v) if k.startswith("optimizer.velocity.") else v
                     for k, v in state.items()}
        run.load_state_dict(state)
        if left_out == "random":      # the state a fresh handler starts from
            run.net.parameters.h.set_random_state(
                make_handler(handler_id, seed=rw.HANDLER_SEED).random_state())
        elif left_out == "shuffle":
            run.rng = np.random.default_rng(rw.SHUFFLE_SEED)
        run.fit(x, y, E)
    assert run.epoch == (E - 2 if left_out == "parameters-only" else E)
    bad = differing(run.state_dict(), want, "net.")
    assert bad, f"leaving out {left_out} changed no parameter"


@pytest.mark.parametrize("graph, at, where", [(False, 2 * STEPS - 3, (1, STEPS - 3)),
                                              (True, 3, (0, 3))], ids=["eager", "graph"])
@pytest.mark.parametrize("opt, precision", [("sgd", None), ("adam", "bf16"), ("adamw", "fp16")],
                         ids=["sgd", "adam-bf16", "adamw-fp16"])
def test_ctrl_c_inside_an_epoch_resumes_bit_exact(handler, handler_id, opt, precision, graph,
                                                 at, where, tmp_path):
    """SIGINT during a step (the Interrupter's ``at``-th training forward):
    fit(..., checkpoint=path) completes that step, saves, and raises
    KeyboardInterrupt; the file holds the position (epoch, step) =
    ``where``, and a fresh run loaded from it ends bit-exact.  (Captured,
    the Interrupter runs only in the eager warm-up step and the two
    captures, the first three steps; at 3 it fires in a capture.)"""
    needs_float32(handler, precision)
    x, y = rw.problem()
    want, want_history, _ = uninterrupted(handler_id, opt, precision, graph)
    path = tmp_path / "run.safetensors"
    stopped = rw.build(handler_id, opt, precision, graph, interrupter=rw.Interrupter(at=at))
    with pytest.raises(KeyboardInterrupt):
        stopped.fit(x, y, E, checkpoint=path)
    assert (stopped.epoch, stopped.step) == where
    saved = checkpoint.load(path)
    assert (saved["trainer.epoch"], saved["trainer.step"]) == where
    assert_same_state(checkpoint.subset(saved, "net."), stopped.net.state_dict())
    assert_same_state(checkpoint.subset(saved, "optimizer."), stopped.optimizer.state_dict())
    run = fresh(handler_id, opt, precision, graph)
    run.load(path)
    assert (run.epoch, run.step) == where
    history = run.fit(x, y, E)
    assert len(run._step.captured) == (2 if graph else 0)
    assert_same_state(run.state_dict(), want.state_dict())
    epoch = where[0]
    assert records(history) == records(want_history)[epoch:]
    assert history.step_losses == want_history.step_losses[epoch * STEPS:]


def test_checkpoint_every_saves_every_nth_epoch_and_the_last(handler, handler_id, tmp_path):
    """fit(x, y, 3, checkpoint=p, checkpoint_every=2) saves after epoch 2
    (not after 1) and after the last, 3; the epoch-2 file, copied when
    on_epoch sees it, resumes to the same end."""
    x, y = rw.problem()
    path = tmp_path / "run.safetensors"
    seen = []

    def on_epoch(record):
        epoch = checkpoint.load(path)["trainer.epoch"] if path.exists() else None
        seen.append(epoch)
        if epoch is not None:
            shutil.copy(path, tmp_path / f"epoch{epoch}.safetensors")

    run = rw.build(handler_id, "adam")
    run.fit(x, y, 3, on_epoch=on_epoch, checkpoint=path, checkpoint_every=2)
    assert len(seen) == 3 and 1 not in seen and 2 in seen, seen
    final = checkpoint.load(path)
    assert (final["trainer.epoch"], final["trainer.step"]) == (3, 0)
    assert_same_state(final, run.state_dict())
    middle = checkpoint.load(tmp_path / "epoch2.safetensors")
    assert differing(middle, final, "net.")
    resumed = fresh(handler_id, "adam", None, None)
    resumed.load(tmp_path / "epoch2.safetensors")
    resumed.fit(x, y, 3)
    assert_same_state(resumed.state_dict(), final)


def test_going_on_in_the_same_process_after_ctrl_c(handler, handler_id, tmp_path):
    """After a Ctrl-C out of fit (no checkpoint path), the same trainer can
    be saved, and fit again goes on from the next step to the uninterrupted
    run's end."""
    x, y = rw.problem()
    want = uninterrupted(handler_id, "sgd", None, False)[0].state_dict()
    run = rw.build(handler_id, "sgd", None, False, interrupter=rw.Interrupter(at=STEPS + 2))
    with pytest.raises(KeyboardInterrupt):
        run.fit(x, y, E)
    assert (run.epoch, run.step) == (1, 2)
    run.save(tmp_path / "run.safetensors")
    run.fit(x, y, E)
    assert_same_state(run.state_dict(), want)


def test_a_loaded_run_saves_what_it_loaded(handler, handler_id, tmp_path):
    """A run loaded from a file saved inside an epoch, saved again before it
    resumes, writes the same state (and the copy loads)."""
    x, y = rw.problem()
    path, again = tmp_path / "run.safetensors", tmp_path / "again.safetensors"
    stopped = rw.build(handler_id, "sgd", None, False, interrupter=rw.Interrupter(at=3))
    with pytest.raises(KeyboardInterrupt):
        stopped.fit(x, y, E, checkpoint=path)
    run = fresh(handler_id, "sgd", None, False)
    run.load(path)
    run.save(again)
    fresh(handler_id, "sgd", None, False).load(again)
    assert_same_state(checkpoint.load(again), checkpoint.load(path))


# ------------------------------------------------------------------ new processes
#: the runs whose phases run in processes of their own (``resume_worker`` RUNs)
PROCESS_RUNS = ["sgd-none", "adam-none", "sgd-bf16", "adam-bf16", "adam-fp16"]
#: the run stopped by a Ctrl-C, from inside (the Interrupter) and from outside
CTRL_C_RUN = "sgd-none"


def worker(handler_id, mode, folder, *runs, check=True):
    """Run tests/resume_worker.py in a new process; its CompletedProcess."""
    done = subprocess.run([sys.executable, str(WORKER), handler_id, mode, str(folder), *runs],
                          cwd=ROOT, env=worker_env(), capture_output=True, text=True,
                          timeout=WORKER_LIMIT)
    if check:
        assert done.returncode == 0, f"{mode}: {done.stdout}{done.stderr}"
    return done


def worker_env():
    """This environment with the repository root first on PYTHONPATH."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + paths))


def ctrl_c_from_outside(handler_id, folder, run):
    """The ``wait`` worker, sent a real SIGINT a few (slowed) training
    forwards after its first one; its CompletedProcess."""
    ready = folder / "wait" / f"{run}.ready"
    proc = subprocess.Popen([sys.executable, str(WORKER), handler_id, "wait", str(folder), run],
                            cwd=ROOT, env=worker_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        begin = time.monotonic()
        while not ready.exists() and proc.poll() is None \
                and time.monotonic() - begin < WORKER_LIMIT:
            time.sleep(0.005)
        if ready.exists():
            time.sleep(3.5 * rw.SLOW_S)     # some steps on: inside a forward most likely
            proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=WORKER_LIMIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def killed_by_ctrl_c(done):
    """Whether a worker ended on an uncaught KeyboardInterrupt (Python then
    exits by SIGINT; 130 where it cannot)."""
    return done.returncode in (-signal.SIGINT, 128 + signal.SIGINT) \
        and "KeyboardInterrupt" in done.stderr


_PROCESSES = {}


@pytest.fixture
def processes(handler, handler_id, tmp_path_factory):
    """Every process case of this handler configuration, run once (first
    use): the uninterrupted runs (one process), the runs stopped after two
    epochs (one), the Ctrl-C runs (one each), then every resume (one).
    Returns {"folder", "runs", "interrupt", "wait"} (the last two the Ctrl-C
    workers' CompletedProcess)."""
    if handler_id not in _PROCESSES:
        try:
            folder = tmp_path_factory.mktemp(f"resume-{handler_id}")
            runs = [r for r in PROCESS_RUNS
                    if handler.dtype == np.float32 or r.endswith("-none")]
            worker(handler_id, "full", folder, *runs)
            worker(handler_id, "stop", folder, *runs)
            done = {"folder": folder, "runs": runs,
                    "interrupt": worker(handler_id, "interrupt", folder, CTRL_C_RUN,
                                        check=False),
                    "wait": ctrl_c_from_outside(handler_id, folder, CTRL_C_RUN)}
            saved = [f"{mode}/{run}" for mode, names in
                     (("stop", runs), ("interrupt", [CTRL_C_RUN]), ("wait", [CTRL_C_RUN]))
                     for run in names if (folder / mode / f"{run}.safetensors").exists()]
            worker(handler_id, "resume", folder, *saved)
            _PROCESSES[handler_id] = done
        except Exception as e:            # the other cases fail at once, the same way
            _PROCESSES[handler_id] = e
    done = _PROCESSES[handler_id]
    if isinstance(done, Exception):
        raise done
    return done


def check_resumed(folder, mode, run, handler_id):
    """The run resumed from ``mode``'s file ends as the uninterrupted run,
    which trained, and the saved state lies before its end."""
    want = checkpoint.load(folder / "full" / f"{run}.safetensors")
    initial = rw.build(handler_id, *rw.parse_run(run)).net.state_dict()
    assert_trained(want, initial)
    saved = checkpoint.load(folder / mode / f"{run}.safetensors")
    assert differing(saved, want, "net.")
    assert_same_state(checkpoint.load(folder / "resumed" / mode / f"{run}.safetensors"), want)
    return saved


@pytest.mark.parametrize("run", PROCESS_RUNS)
def test_resume_in_a_new_process_is_bit_exact(handler, handler_id, run, processes):
    """Phase 1 (two epochs, then save) and phase 2 (load, fit to four) each
    in a process of its own end bit-exact with the run uninterrupted in a
    third."""
    needs_float32(handler, rw.parse_run(run)[1])
    saved = check_resumed(processes["folder"], "stop", run, handler_id)
    assert (saved["trainer.epoch"], saved["trainer.step"]) == (rw.STOP_AT, 0)


def test_ctrl_c_in_a_new_process_resumes_bit_exact(handler_id, processes):
    """A Ctrl-C at step 3 of the first epoch ends the process on
    KeyboardInterrupt after fit saved the run; a new process resumes from
    there bit-exact."""
    done = processes["interrupt"]
    assert killed_by_ctrl_c(done), (done.returncode, done.stdout + done.stderr)
    saved = check_resumed(processes["folder"], "interrupt", CTRL_C_RUN, handler_id)
    assert (saved["trainer.epoch"], saved["trainer.step"]) == (0, rw.INTERRUPT_AT)


def test_a_real_ctrl_c_from_outside_resumes_bit_exact(handler_id, processes):
    """SIGINT sent to the training process from outside, wherever in a step
    it lands (the training forwards sleep, so mostly inside one): the
    process ends on KeyboardInterrupt with the run saved at a step boundary
    strictly inside the run, from which a new process resumes bit-exact."""
    done = processes["wait"]
    assert killed_by_ctrl_c(done), (done.returncode, done.stdout + done.stderr)
    saved = check_resumed(processes["folder"], "wait", CTRL_C_RUN, handler_id)
    position = saved["trainer.epoch"] * STEPS + saved["trainer.step"]
    assert 1 <= position < E * STEPS, (saved["trainer.epoch"], saved["trainer.step"])


# ------------------------------------------------------------------ convolutions
def conv_run(handler_id, init_seed=rw.INIT_SEED):
    """A small conv net on 8x8 images (Conv2D, ReLU, MaxPool2D, Dropout,
    Flatten, FullyConnected) with Adam, captured where the handler prefers."""
    from layers import (
        Adam,
        Conv2D,
        Dropout,
        Flatten,
        FullyConnected,
        MaxPool2D,
        ReLU,
        Sequential,
        SoftmaxCrossEntropy,
        Trainer,
    )
    h = make_handler(handler_id, seed=rw.HANDLER_SEED)
    net = Sequential(h, [Conv2D(1, 6, 3, padding=1), ReLU(), MaxPool2D(2), Dropout(0.2),
                         Flatten(), FullyConnected(6 * 4 * 4, 3)],
                     SoftmaxCrossEntropy(), seed=init_seed)
    return Trainer(net, Adam(net.parameters, lr=0.01), batch_size=16, seed=rw.SHUFFLE_SEED,
                   progress=False)


def test_conv_net_resumes_bit_exact(handler, handler_id, tmp_path):
    """A conv net saved after one of three epochs and resumed on a new
    handler ends bit for bit where the saved run ends when it goes on.  On a
    GPU each handler times cuDNN's engines, and two handlers may choose
    differently (so two uninterrupted runs may differ in the last bits): the
    checkpoint carries the saved run's choices (``trainer.engines``) and the
    resumed handler takes them, which the whole-state comparison checks."""
    r = np.random.default_rng(3)
    x = r.standard_normal((70, 1, 8, 8)).astype(np.float32)
    y = r.integers(0, 3, 70)
    first = conv_run(handler_id)
    initial = first.net.state_dict()
    first.fit(x, y, 1)
    first.save(tmp_path / "conv.safetensors")
    first.fit(x, y, 3)
    want = first.state_dict()
    assert_trained(want, initial)
    resumed = conv_run(handler_id, init_seed=rw.OTHER_INIT_SEED)
    resumed.load(tmp_path / "conv.safetensors")
    resumed.fit(x, y, 3)
    assert_same_state(resumed.state_dict(), want)
    if hasattr(handler, "conv_engines"):   # the engines were chosen, and saved
        assert want["trainer.engines"]
