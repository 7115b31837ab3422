"""Data-parallel training and process groups.

Two ranks on the CPU: ``mpiexec -n 2`` runs ``tests/dp_worker.py`` (NumpyHandler,
MPI), whose parameters and step losses must match single-process training on
the same global batches, and whose faults (a rank that raises, hangs or dies;
ranks that build different networks) must end the job with a clear error
within a bounded time.  Where two GPUs, pycuda and nccl4py are present, the
same on PyCudaHandler through NCCL (each case against one GPU, and a hung
rank caught by the watchdog).  In-process: the group of one, the shard and
bucket arithmetic, float16's combined overflow flags, the checks, the
optional imports, and the dp benchmark's tables on canned reports.  The
mpiexec tests skip with the reason where mpi4py or mpiexec is missing (``pip
install 'streamhandlers[test]'`` installs both).
"""
import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import dp_worker
from handlers import NumpyHandler, process_group
from handlers.graphs import issue_work
from helpers import differing
from layers import SGD, FullyConnected, Sequential, SoftmaxCrossEntropy, Tanh, Trainer, checkpoint
from layers.data_parallel import DataParallel, shard_bounds

WORKER = Path(dp_worker.__file__)
#: seconds a whole mpiexec run may take before the test fails (hangs included)
RUN_LIMIT = 60
#: the process group's timeout in the fault tests
FAULT_TIMEOUT = 3


def find_mpiexec():
    """The mpiexec beside this interpreter (the mpich wheel puts it there), else
    mpiexec or mpirun on PATH; None if there is none."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec") or shutil.which("mpirun")


def launcher_env(**extra):
    """This environment without a launcher's variables (pytest itself may run
    under one), plus ``extra``.  Open MPI refuses to run as root without its
    two variables; other launchers ignore them."""
    env = {k: v for k, v in os.environ.items()
           if k not in process_group.SIZE_VARIABLES + process_group.RANK_VARIABLES}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra)
    return env


def mpiexec(*args, timeout=None, **env):
    """Run the worker on two ranks; returns (exit status, output, seconds)."""
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install mpi4py mpich)")
    exe = find_mpiexec()
    if exe is None:
        pytest.skip("no mpiexec beside the interpreter nor on PATH (pip install mpich)")
    start = time.monotonic()
    done = subprocess.run([exe, "-n", "2", sys.executable, str(WORKER), *args],
                          capture_output=True, text=True, timeout=timeout or RUN_LIMIT,
                          env=launcher_env(**env), cwd=WORKER.parents[1])
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


# ------------------------------------------------------------------ two ranks
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every case of dp_worker.CASES trained on two ranks, in one mpiexec run."""
    out = tmp_path_factory.mktemp("dp")
    code, text, _ = mpiexec("train", str(out), *dp_worker.CASES)
    assert code == 0, text
    return out


def check_against_one_process(case, folder, gpu):
    """Both ranks' results in ``folder`` equal each other and match ``case``
    trained here in one process on the same global batches."""
    ranks = [np.load(folder / f"{case}-rank{r}.npz") for r in (0, 1)]
    assert np.array_equal(ranks[0]["params"], ranks[1]["params"]), "the ranks diverged"
    assert np.array_equal(ranks[0]["losses"], ranks[1]["losses"])
    params, losses = dp_worker.train(case, data_parallel=False, gpu=gpu)
    model, dtype, opts = dp_worker.CASES[case]
    # A half format rounds each shard's gradients where one process rounds the
    # batch's; on a GPU the sums' order also differs with the batch size.
    if opts.get("precision"):
        tol = 2e-2
    elif dtype == np.float64:
        tol = 1e-10 if gpu else 1e-12
    else:
        tol = 5e-5 if gpu else 2e-6
    scale = np.abs(params).max()
    assert np.abs(ranks[0]["params"] - params).max() <= tol * scale
    np.testing.assert_allclose(ranks[0]["losses"], losses, rtol=tol * 10, atol=0)


@pytest.mark.parametrize("case", list(dp_worker.CASES))
def test_two_ranks_match_one_process(case, trained):
    check_against_one_process(case, trained, gpu=False)


def test_ranks_shuffle_as_rank_0_whatever_their_seeds(trained):
    """Ranks whose trainers were given different seeds still shuffle every
    epoch identically, as rank 0 (the trainer takes rank 0's generator
    state): both ranks match one process trained with rank 0's seed, which
    they could not if each shuffled with its own."""
    opts = dp_worker.CASES["mlp-f64-rank-seeds"][2]
    n = opts["n"]
    assert opts["rank_seeds"]
    assert not np.array_equal(np.random.default_rng(7).permutation(n),
                              np.random.default_rng(1007).permutation(n))   # the premise
    check_against_one_process("mlp-f64-rank-seeds", trained, gpu=False)


def two_gpus_or_skip():
    """Skip unless pycuda, nccl4py and two GPUs are here."""
    for module, what in (("pycuda", "pycuda"), ("nccl", "nccl4py")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"data parallel on GPUs: {what} is not installed")
    import pycuda.driver as drv
    try:
        drv.init()
        count = drv.Device.count()
    except drv.Error as e:
        pytest.skip(f"data parallel on GPUs: no usable GPU ({e})")
    if count < 2:
        pytest.skip(f"data parallel on GPUs needs two GPUs, found {count}")


@pytest.fixture(scope="module")
def trained_on_gpus(tmp_path_factory):
    """Every case trained on two GPUs (NCCL), in one mpiexec run."""
    two_gpus_or_skip()
    out = tmp_path_factory.mktemp("dp-gpu")
    code, text, _ = mpiexec("train-gpu", str(out), *dp_worker.CASES, timeout=300)
    assert code == 0, text
    return out


@pytest.mark.timeout(400)   # the first case's setup trains them all (up to 300 s)
@pytest.mark.parametrize("case", list(dp_worker.CASES))
def test_two_gpus_match_one_gpu(case, trained_on_gpus):
    check_against_one_process(case, trained_on_gpus, gpu=True)


def test_a_gpu_rank_that_hangs_is_caught_by_the_watchdog():
    two_gpus_or_skip()
    code, text, seconds = mpiexec("hang-gpu", ".", STREAMHANDLERS_TIMEOUT=str(FAULT_TIMEOUT),
                                  timeout=120)
    assert code != 0, text
    assert "rank 0 of 2: the GPU work of a training step has not finished after 3 s" in text \
        or "CollectiveTimeoutError" in text, text
    assert seconds < FAULT_TIMEOUT + 60, seconds


def test_a_rank_that_raises_ends_the_job():
    code, text, seconds = mpiexec("raise", ".")
    assert code != 0, text
    assert "rank 1 fails on purpose" in text, text
    assert "rank 1 of 2 stopped on RuntimeError; aborting the job" in text, text
    assert seconds < RUN_LIMIT


def test_a_rank_that_hangs_times_the_others_out():
    code, text, seconds = mpiexec("hang", ".", STREAMHANDLERS_TIMEOUT=str(FAULT_TIMEOUT))
    assert code != 0, text
    assert "CollectiveTimeoutError" in text, text
    assert f"rank 0 of 2 waited {FAULT_TIMEOUT} s for 2 all-reduces" in text, text
    assert seconds < FAULT_TIMEOUT + 20, seconds


def test_a_rank_that_dies_ends_the_job():
    code, text, seconds = mpiexec("die", ".", STREAMHANDLERS_TIMEOUT=str(FAULT_TIMEOUT))
    assert code != 0, text
    assert seconds < FAULT_TIMEOUT + 20, seconds


def test_a_rank_that_never_starts_times_the_others_out(tmp_path):
    code, text, seconds = mpiexec("late", str(tmp_path), STREAMHANDLERS_TIMEOUT=str(FAULT_TIMEOUT))
    assert code != 0, text
    assert f"Timeout (0:00:0{FAULT_TIMEOUT})!" in text and "mpi_group.py" in text, text
    # Rank 0's own lifetime where the late rank saw it end (the launcher may
    # not end the job at once when rank 0 exits), else the job's.
    lived = re.search(r"late: rank 0 ended ([0-9.]+) s after it started", text)
    assert (float(lived.group(1)) if lived else seconds) < FAULT_TIMEOUT + 20, text


def resume_jobs(out, gpu):
    """Every case of dp_worker.RESUME_CASES on two ranks: uninterrupted and
    stopped after RESUME_STOP epochs (saved) in one mpiexec job, resumed from
    that file in a second (on two GPUs with ``gpu``)."""
    tail = "-gpu" if gpu else ""
    for scenario in ("resume-run", "resume-continue"):
        code, text, _ = mpiexec(scenario + tail, str(out), *dp_worker.RESUME_CASES,
                                timeout=300)
        assert code == 0, text
    return out


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """The resume cases on two CPU ranks (``resume_jobs``)."""
    return resume_jobs(tmp_path_factory.mktemp("dp-resume"), gpu=False)


@pytest.fixture(scope="module")
def resumed_on_gpus(tmp_path_factory):
    """The resume cases on two GPUs (``resume_jobs``)."""
    two_gpus_or_skip()
    return resume_jobs(tmp_path_factory.mktemp("dp-resume-gpu"), gpu=True)


@pytest.mark.parametrize("case", list(dp_worker.RESUME_CASES))
def test_two_ranks_resume_bit_exact(case, resumed):
    """Two CPU ranks: see ``check_resume``."""
    check_resume(case, resumed)


@pytest.mark.parametrize("case", list(dp_worker.RESUME_CASES))
def test_two_gpus_resume_bit_exact(case, resumed_on_gpus):
    """Two GPUs (NCCL), the step captured: see ``check_resume``."""
    check_resume(case, resumed_on_gpus)


def check_resume(case, resumed):
    """Data parallel with dropout (each rank its own random state): stopped
    after two epochs, saved (rank 0 writes) and resumed by a new job to four,
    every rank ends with the uninterrupted run's whole trainer state
    (parameters, optimizer, random and shuffling states) bit for bit, and
    the ranks agree.  Control: the resumed run given rank 0's random state
    on every rank ends elsewhere."""
    def load(name):
        return checkpoint.load(resumed / f"{case}{name}.safetensors")

    saved = load("")
    assert (saved["trainer.epoch"], saved["trainer.step"]) == (dp_worker.RESUME_STOP, 0)
    randoms = saved["trainer.random"]
    assert len(randoms) == 2 and randoms[0] != randoms[1], "one random state per rank"
    full = [load(f"-full-rank{r}") for r in (0, 1)]
    again = [load(f"-resumed-rank{r}") for r in (0, 1)]
    assert not differing(full[1], full[0]), "the ranks' states differ"
    for r in (0, 1):
        assert not differing(again[r], full[r]), f"rank {r}: the resumed run differs"
    dtype = dp_worker.RESUME_CASES[case][0]
    initial = dp_worker.resume_network(NumpyHandler(dtype)).state_dict()
    assert len(differing(checkpoint.subset(full[0], "net."), initial)) == len(initial), \
        "every parameter trains"
    assert differing(saved, full[0], "net."), "the last epochs change the parameters"
    assert differing(load("-rank0-random-rank0"), full[0], "net."), \
        "rank 0's random state on every rank changes nothing"


def test_different_networks_are_refused_at_the_start():
    code, text, _ = mpiexec("layout", ".")
    assert code != 0, text
    assert "ValueError: process group of 2: rank 1's parameter layout differs from rank 0's" \
        in text, text


# ------------------------------------------------------------------ in process
@pytest.fixture
def no_launcher(monkeypatch):
    for name in process_group.SIZE_VARIABLES + process_group.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def small_net(h):
    return Sequential(h, [FullyConnected(4, 6), Tanh(), FullyConnected(6, 3)],
                      SoftmaxCrossEntropy(), seed=0)


def test_group_of_one_without_a_launcher(no_launcher):
    g = process_group.process_group(NumpyHandler(np.float64))
    assert (g.rank, g.size, g.local_rank, g.backend) == (0, 1, 0, "none")
    a = np.arange(3.0)
    g.allreduce(None, a)
    g.complete(None)
    g.broadcast(None, a)
    assert a.tolist() == [0.0, 1.0, 2.0]
    assert g.allgather_object({"x": 1}) == [{"x": 1}]
    assert g.broadcast_object(5) == 5
    g.agree("anything", (1, 2))


def test_group_of_one_trains_as_without_the_switch(no_launcher, rng):
    x, y = rng.standard_normal((45, 4)), rng.integers(0, 3, 45)
    runs = []
    for dp in (False, True):
        h = NumpyHandler(np.float64)
        net = small_net(h)
        trainer = Trainer(net, SGD(net.parameters, lr=0.1), batch_size=8, progress=False,
                          data_parallel=dp)
        losses = trainer.fit(x, y, 2).step_losses
        runs.append((h.get_numpy_copy(net.params), losses))
    assert np.array_equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]


def test_launched_size_reads_the_launchers_variables(no_launcher, monkeypatch):
    assert process_group.launched_size() is None
    monkeypatch.setenv("PMIX_RANK", "0")
    assert process_group.launched_size() == 0       # started, size unknown: ask MPI
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert process_group.launched_size() == 4


def test_timeout_is_checked(monkeypatch):
    assert process_group.timeout_from(2) == 2.0
    monkeypatch.setenv("STREAMHANDLERS_TIMEOUT", "7.5")
    assert process_group.timeout_from(None) == 7.5
    for bad in (0, -1, float("inf"), float("nan"), "soon", True):
        with pytest.raises(ValueError, match="positive number of seconds"):
            process_group.timeout_from(bad)
    monkeypatch.setenv("STREAMHANDLERS_TIMEOUT", "x")
    with pytest.raises(ValueError, match="STREAMHANDLERS_TIMEOUT"):
        process_group.timeout_from(None)


def test_missing_mpi4py_under_a_launcher_is_named(no_launcher, monkeypatch):
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mpi4py" else find(name, *a))
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(ImportError, match="mpi4py is not installed"):
        process_group.process_group()


def test_imports_need_neither_mpi4py_nor_nccl():
    code = ("import sys; sys.modules['mpi4py'] = None; sys.modules['nccl'] = None\n"
            "import handlers, layers, handlers.process_group, layers.data_parallel\n"
            "import handlers.cuda.nccl as n\n"
            "try:\n    n.load_nccl()\nexcept ImportError as e:\n    print('nccl:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=WORKER.parents[1], env=launcher_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "nccl: NcclGroup: several processes with a PyCudaHandler need nccl4py" \
        in done.stdout


class FakeGroup(process_group.ProcessGroup):
    """Rank ``rank`` of ``size`` whose collectives record what they get; its
    all-reduce adds ``other(a)``, what the other ranks are taken to hold (by
    default nothing)."""

    def __init__(self, rank, size, other=None):
        super().__init__(rank, size, timeout=10)
        self.log, self.other = [], other

    def allreduce(self, h, a):
        self.log.append(("allreduce", h.group, a.size))
        if self.other is not None:
            a += self.other(a)      # NumpyHandler: the work before it has run

    def broadcast(self, h, a, root=0):
        self.log.append(("broadcast", h.group, a.size))


def test_shards_cover_every_batch_once():
    for n in (1, 2, 5, 16, 17):
        for size in (1, 2, 3, 4):
            bounds = [shard_bounds(n, r, size) for r in range(size)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1


def test_shard_weight_and_borrowed_sample():
    h = NumpyHandler(np.float64)
    last = DataParallel(small_net(h), process_group=FakeGroup(2, 3))
    assert last.shard(np.arange(10, 17)).tolist() == [14, 15, 16]   # 7 samples: 2, 2, 3
    assert last.shard_size(7) == 3
    dp = DataParallel(small_net(h), process_group=FakeGroup(0, 3))
    assert dp.shard(np.arange(10, 17)).tolist() == [10, 11]
    dp.set_batch(7)
    assert h.get_numpy_copy(dp._weight)[0] == 2 / 7
    assert dp.shard(np.array([4, 5])).tolist() == [4]              # empty part: borrowed
    assert dp.shard_size(2) == 1
    dp.set_batch(2)
    assert h.get_numpy_copy(dp._weight)[0] == 0.0


def test_buckets_follow_backward_and_the_parameters_are_broadcast():
    h = NumpyHandler(np.float64, num_stream_groups=3)
    net = small_net(h)
    group = FakeGroup(0, 2)
    dp = DataParallel(net, process_group=group, bucket_bytes=8)
    assert group.log == [("broadcast", 0, net.params.size)]
    offsets = sorted(off for _, _, off, _ in net.parameters.entries)
    # one region per parameterized layer, the last layer's first
    assert [r.size for r in dp.buckets] == [net.parameters.size - offsets[2], offsets[2]]
    group.log.clear()
    dp.train_step(h.create_from_numpy(np.ones((4, 4))), h.create_from_numpy(np.zeros((4, 1))))
    assert group.log == [("allreduce", 2, r.size) for r in dp.buckets] + [("allreduce", 2, 1)]


def test_a_bucket_of_exactly_one_layers_size_holds_that_layer_alone():
    """``bucket_bytes`` equal to the last layer's gradient bytes closes a
    bucket at that layer (a region of ``bucket_bytes`` or more), not one
    layer later: one region per layer here, each all-reduced once, in
    backward's order."""
    h = NumpyHandler(np.float64, num_stream_groups=3)
    net = Sequential(h, [FullyConnected(4, 6), Tanh(), FullyConnected(6, 20), Tanh(),
                         FullyConnected(20, 3)], SoftmaxCrossEntropy(), seed=0)
    starts = sorted({min(off for lay, _, off, _ in net.parameters.entries if lay is layer)
                     for layer, _, _, _ in net.parameters.entries})
    regions = [b - a for a, b in zip(starts, starts[1:] + [net.parameters.size])]
    assert regions[2] < regions[1]     # the last layer's region is the smallest of the two
    group = FakeGroup(0, 2)
    dp = DataParallel(net, process_group=group, bucket_bytes=regions[2] * 8)
    assert [r.size for r in dp.buckets] == regions[::-1]
    group.log.clear()
    dp.train_step(h.create_from_numpy(np.ones((4, 4))), h.create_from_numpy(np.zeros((4, 1))))
    assert group.log == [("allreduce", 2, n) for n in regions[::-1]] + [("allreduce", 2, 1)]


@pytest.fixture
def fresh_groups(no_launcher, monkeypatch):
    """process_group's cache emptied for the test (and put back after)."""
    monkeypatch.delenv("STREAMHANDLERS_TIMEOUT", raising=False)
    saved = dict(process_group.groups_made)
    process_group.groups_made.clear()
    yield
    process_group.groups_made.clear()
    process_group.groups_made.update(saved)


def test_a_later_process_group_call_with_a_timeout_sets_it(fresh_groups):
    """``process_group`` returns the one cached group, and a timeout given to
    a later call becomes that group's; a call without one keeps it."""
    h = NumpyHandler(np.float64)
    first = process_group.process_group(h)
    assert first.timeout == process_group.DEFAULT_TIMEOUT
    second = process_group.process_group(h, timeout=7)
    assert second is first and first.timeout == 7.0
    assert process_group.process_group(h, timeout=2.5).timeout == 2.5
    third = process_group.process_group(h)
    assert third is first and first.timeout == 2.5
    assert process_group.process_group(None).timeout == 2.5   # host collectives: the same
    with pytest.raises(ValueError, match="positive number of seconds"):
        process_group.process_group(h, timeout=0)
    assert first.timeout == 2.5


@pytest.mark.parametrize("other_overflowed", [False, True])
def test_float16_overflow_on_any_rank_skips_the_step_everywhere(other_overflowed, rng):
    h = NumpyHandler(np.float32)
    net = small_net(h)
    net.mixed_precision("float16")
    scaler = net.loss_scaler

    def other(a):      # rank 1 holds what this rank holds, but its flag may say overflow
        return np.zeros_like(a) if a is scaler.flag and other_overflowed else a.copy()

    dp = DataParallel(net, process_group=FakeGroup(0, 2, other))
    opt = SGD(net.parameters, lr=0.1)
    before = h.get_numpy_copy(net.params)
    dp.set_batch(8)
    dp.train_step(net.h.create_from_numpy(rng.standard_normal((4, 4))),
                  net.h.create_from_numpy(rng.integers(0, 3, (4, 1))))
    scaler.step(opt)
    stepped = not np.array_equal(h.get_numpy_copy(net.params), before)
    assert stepped is not other_overflowed
    assert scaler.loss_scale == 2.0 ** (14 if other_overflowed else 15)


def test_mixed_precision_begun_after_the_data_parallel_step_is_made(rng):
    """As Trainer(net, opt, precision="bf16", data_parallel=dp) does: the
    step then returns the loss in the compute format, summed over the ranks."""
    x, y = rng.standard_normal((4, 4)), rng.integers(0, 3, (4, 1))
    alone = small_net(NumpyHandler(np.float32))
    alone.mixed_precision("bfloat16")
    want = alone.h.get_numpy_copy(alone.train_step(alone.h.create_from_numpy(x),
                                                   alone.h.create_from_numpy(y)))
    net = small_net(NumpyHandler(np.float32))
    # the other rank holds this rank's shard again: half of each, summed
    dp = DataParallel(net, process_group=FakeGroup(0, 2, lambda a: a.copy()))
    net.mixed_precision("bfloat16")
    dp.set_batch(8)
    loss = dp.train_step(net.h.create_from_numpy(x), net.h.create_from_numpy(y))
    assert loss.dtype == net.h.dtype and loss.shape == (1,)
    np.testing.assert_array_equal(net.h.get_numpy_copy(loss), want)


def test_bad_settings_are_refused(no_launcher):
    h = NumpyHandler(np.float64)
    net = small_net(h)
    for bad in (0, -8, 2.5, True):
        with pytest.raises(ValueError, match="bucket_bytes must be a positive int"):
            DataParallel(net, bucket_bytes=bad)
    with pytest.raises(ValueError, match="with_streams"):
        DataParallel(net, stream_group=9)
    with pytest.raises(TypeError, match="data_parallel must be a bool or a DataParallel"):
        Trainer(net, SGD(net.parameters), progress=False, data_parallel="yes")
    other = DataParallel(small_net(h))
    with pytest.raises(ValueError, match="DataParallel of another network"):
        Trainer(net, SGD(net.parameters), progress=False, data_parallel=other)


def test_issued_work_is_recorded_by_a_capture():
    h = NumpyHandler(np.float64)
    calls = []
    with h.capture() as g:
        issue_work(h, "collective", calls.append, 1)
    assert calls == []                     # NumpyHandler's capture only records
    g.replay()
    g.replay()
    assert calls == [1, 1]


# ------------------------------------------------------------------ the dp benchmark
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
def test_dp_benchmark_ends_a_job_past_its_time_whole(tmp_path, capsys):
    """A job that outlives --job-timeout is reported and ended with every
    process it started, and the suite goes on (launch returns None)."""
    from benchmarks import dp
    pid_file = tmp_path / "child.pid"
    launcher = tmp_path / "launcher.sh"        # a launcher whose rank never ends
    launcher.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pid_file}\nwait\n")
    launcher.chmod(0o755)
    args = argparse.Namespace(reps=1, small=True, job_timeout=2)
    start = time.monotonic()
    assert dp.launch(str(launcher), 2, "ours", "mlp", args) is None
    assert time.monotonic() - start < 30
    assert "did not end within 2 s" in capsys.readouterr().out
    child = int(pid_file.read_text())
    for _ in range(100):                      # SIGKILL is delivered, then reaped
        if not dp_worker._alive(child):
            break
        time.sleep(0.05)
    assert not dp_worker._alive(child)


def test_dp_benchmark_skips_here_or_reports(monkeypatch, capsys):
    """Without two GPUs the suite says why it skipped; its tables, targets and
    checks are exercised on canned job reports (the jobs need two GPUs)."""
    from benchmarks import dp
    reason = dp.why_not(dp.find_launcher(None))
    if reason is not None:
        assert dp.main([]) == 0
        assert "dp: skipped" in capsys.readouterr().out
    speed = {("ours", 1): 100.0, ("ours", 2): 195.0, ("torch", 1): 90.0, ("torch", 2): 170.0,
             ("shard", 1): 190.0}   # one GPU on half the batch (samples/s of that job)

    def fake_launch(launcher, ranks, work, model, args):
        if work == "bandwidth":
            paths = {k: {"ms": {"median": t}, "slowest_median_ms": t,
                         "bus_gb_s": 2 * 1 / 2 * 4e6 / (t / 1e3) / 1e9}
                     for k, t in (("ours, one call", 0.02), ("ours, 1 buckets", 0.021),
                                  ("NCCL (its all_reduce binding, raw buffer)", 0.019))}
            return {"bytes": 4_000_000, "ranks": 2, "paths": paths}
        report = {"ms": {"median": 1e3 / speed[work, ranks]},
                  "samples_per_s": speed[work, ranks]}
        if work in ("ours", "shard"):
            report.update(sample=[1.0, 2.0 + 1e-7 * ranks], same_on_ranks=True, buckets=1)
        return report

    monkeypatch.setattr(dp, "why_not", lambda launcher: None)
    monkeypatch.setattr(dp, "launch", fake_launch)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, find=importlib.util.find_spec:
                        object() if name == "torch" else find(name, *a))
    assert dp.main(["--small", "--mpirun", "mpirun"]) == 0
    out = capsys.readouterr().out
    assert "target: mlp 2 GPUs >= 1.85x 1 GPU: 1.950x met" in out, out
    assert "target: lstm ours on 2 GPUs >= 1.0x PyTorch DDP: 1.147x met" in out, out
    assert "NCCL (its all_reduce binding, raw buffer)" in out, out
    assert "checks: 2 of 2 agree" in out, out
    # the shard job's step: 1e3 / 190 ms against 1e3 / 100 ms for the whole batch
    assert "so 2 GPUs can reach at most 1.900x" in out, out
