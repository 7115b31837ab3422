"""Run the benchmark code on tiny sizes so it cannot rot.  No timing is checked."""
import math
import re

import pytest

from benchmarks import __main__ as cli
from benchmarks import mxb, reductions, report


def test_mxb_prints_table(capsys):
    assert mxb.main(["--n", "64", "--iters", "3"]) == 0
    out = capsys.readouterr().out
    assert "plain NumPy" in out
    assert "NumpyHandler" in out
    assert "target <= 1.10x" in out
    rows = [line for line in out.splitlines() if line.split()[-1:] in (["yes"], ["NO"])]
    assert [r.split()[0] for r in rows][:2] == ["plain", "NumpyHandler"], out
    assert all(r.endswith("yes") for r in rows), out   # each handler computed m @ x + b


def test_cli_dispatch(capsys):
    assert cli.main(["no-such-suite"]) == 2
    assert "unknown suite" in capsys.readouterr().err
    assert cli.main(["mxb", "--n", "8", "--iters", "1", "--repeats", "1"]) == 0
    assert "NumpyHandler" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reductions_numpy_runs_every_section(capsys, dtype):
    """``--handler numpy`` runs the random set, the fixed rows and the fused
    rows of the reductions suite at tiny sizes, every result checked."""
    assert reductions.main(["--handler", "numpy", "--quick", "--seed", "3", "--cases", "5",
                            "--reps", "1", "--dtype", dtype]) == 0
    out = capsys.readouterr().out
    assert "seed 3" in out and f"Random set, seed 3: 5 cases, {dtype}" in out
    for what in ("Fixed rows", "regression", "Fused rows", "LayerNorm backward",
                 "every case >= 0.95x PyTorch's speed"):
        assert what in out, what
    agree = re.search(r"checks: (\d+) of (\d+) agree", out)
    assert agree and agree[1] == agree[2] and int(agree[2]) > 20, out


def test_reductions_skips_or_runs(capsys):
    """Without a GPU the default handler skips, naming the NumPy fallback."""
    assert reductions.main(["--quick", "--cases", "2", "--sections", "random"]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out or "Random set" in out


def test_reductions_random_cases_follow_issue_41():
    """The drawn cases: ranks 1-4, 64 KB to 256 MB, axes each op takes, and
    argmax indices exact in the format; the same seed gives the same cases."""
    for seed in range(20):
        cases = reductions.draw_cases(seed, 48)
        assert cases == reductions.draw_cases(seed, 48)
        for c in cases:
            shape, axis = c["shape"], c["axis"]
            assert 1 <= len(shape) <= 4 and c["op"] in reductions.OPS
            assert 64 << 10 <= 4 * math.prod(shape) <= 256 << 20, c
            if isinstance(axis, tuple):
                assert c["op"] in ("sum_t", "mean_t") and len(axis) >= 2
                assert list(axis) == sorted(set(axis)) and axis[-1] < len(shape)
            else:
                assert axis is None or 0 <= axis < len(shape)
            if c["op"] == "argmax_t":
                assert reductions.reduced_count(shape, axis) <= 2 ** 24 + 1
    every = [c for s in range(20) for c in reductions.draw_cases(s, 48)]
    assert {c["op"] for c in every} == set(reductions.OPS)
    assert {len(c["shape"]) for c in every} == {1, 2, 3, 4}
    assert any(c["axis"] is None for c in every) and any(isinstance(c["axis"], tuple)
                                                         for c in every)
    assert any(d in (1, 2, 3, 4) for c in every for d in c["shape"])
    assert reductions.next_prime(8) == 11 and reductions.next_prime(13) == 13


def test_reductions_is_a_suite_and_reported():
    assert "reductions" in cli.SUITES and "reductions" in report.SUITES


def test_train_breakdown_records_every_compute_op():
    """The train suite's breakdown sees the ops that run through bound fused
    calls and on the loss's twin: each step's epilogues, loss and update are
    recorded in their categories, and the recording replays."""
    from collections import Counter

    import numpy as np

    from benchmarks import train
    from handlers import NumpyHandler
    h = NumpyHandler(np.float32)
    ops, _keep = train.record_step(h, "mlp", train.MODELS["mlp"][1])
    got = Counter((cat, args[0].name if name == "_run_fused" else name)
                  for cat, name, args, _ in ops)
    assert got[("gemm", "dot_mm")] == 5          # the backward's products
    assert got[("gemm", "dot_bias_act")] == 3    # the forward's, bias and ReLU included
    assert got[("elementwise", "bias_relu")] == 0
    assert got[("elementwise", "bias_relu_backward")] == 2
    assert got[("elementwise", "softmax_cross_entropy_labels_grad")] == 1
    assert got[("update", "sgd_momentum_step")] == 1
    assert got[("sum_t (bias, loss)", "sum_t")] == 2     # the output bias and the loss
    assert not any(name == "_bind_fused" for _, name, _, _ in ops)
    train.replay(h, ops)(0)


def test_train_breakdown_replays_a_captured_category():
    """The breakdown times each category from one capture of its ops: the
    captured replay computes what re-issuing them does (a handler that
    captures: NumpyHandler records and replays the calls), and off the GPU
    the suite keeps the eager re-issue (``replayed`` gives None)."""
    import numpy as np

    from benchmarks import train
    from handlers import NumpyHandler
    h = NumpyHandler(np.float32)
    ops, _keep = train.record_step(h, "mlp", train.MODELS["mlp"][1])
    gemms = [op for op in ops if op[0] == "gemm"]
    assert train.replayed(h, gemms, gpu=False) is None
    # dot_mm(a, b, out, ...), dot_bias_act(a, b, bias, out, act)
    outs = [args[3 if name == "dot_bias_act" else 2] for _, name, args, _ in gemms]
    run = train.replayed(h, gemms, gpu=True)
    for out in outs:
        h.fill(out, np.nan)
    run(0)
    got = [h.get_numpy_copy(out).copy() for out in outs]
    assert all(np.isfinite(g).all() for g in got)
    for out in outs:
        h.fill(out, np.nan)
    train.replay(h, gemms)(0)
    for g, out in zip(got, outs):
        np.testing.assert_array_equal(g, h.get_numpy_copy(out))


def test_gpt_suite_numpy_small(capsys):
    """``benchmarks gpt --handler numpy --small``: our float32 step timed,
    the GPU-only rows skipped with the reason."""
    from benchmarks import gpt
    assert gpt.main(["--handler", "numpy", "--small", "--reps", "2"]) == 0
    out = capsys.readouterr().out
    assert "ours" in out and "bf16: skipped on NumPy" in out
