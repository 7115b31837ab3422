"""The digits demo and the training benchmark run (no timing is checked)."""
import pytest

from benchmarks import train as train_bench


@pytest.mark.parametrize("which", ["numpy", "pycuda"])
def test_digits_demo_reaches_target(tmp_path, capsys, which):
    pytest.importorskip("sklearn", reason="the digits demo needs scikit-learn")
    if which == "pycuda":
        try:
            from handlers import PyCudaHandler
            PyCudaHandler()
        except (ImportError, RuntimeError) as e:
            pytest.skip(f"PyCudaHandler unavailable: {e}")
    from examples import digits
    png = tmp_path / "loss.png"
    model = tmp_path / "model.safetensors"
    rc = digits.main(["--handler", which, "--epochs", "12", "--no-progress",
                      "--plot", str(png), "--save", str(model)])
    out = capsys.readouterr().out
    assert rc == 0, out
    name = "NumpyHandler" if which == "numpy" else "PyCudaHandler"
    assert f"handler: {name}" in out and "time per epoch" in out
    assert "test accuracy" in out and "met" in out
    assert model.stat().st_size > 1000 and str(model) in out   # the trained model, saved
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no loss curve" in out
    else:
        assert png.stat().st_size > 1000


@pytest.mark.parametrize("which", ["numpy", "pycuda"])
def test_conv_digits_demo_reaches_target(tmp_path, capsys, which):
    pytest.importorskip("sklearn", reason="the digits demo needs scikit-learn")
    if which == "pycuda":
        try:
            from handlers import PyCudaHandler
            PyCudaHandler()
        except (ImportError, RuntimeError) as e:
            pytest.skip(f"PyCudaHandler unavailable: {e}")
    from examples import conv_digits
    model = tmp_path / "model.safetensors"
    rc = conv_digits.main(["--handler", which, "--no-progress", "--plot", "",
                           "--save", str(model)])
    out = capsys.readouterr().out
    assert rc == 0, out
    name = "NumpyHandler" if which == "numpy" else "PyCudaHandler"
    assert f"handler: {name}" in out and "test accuracy" in out and "met" in out
    assert model.stat().st_size > 1000 and str(model) in out


def test_conv_benchmark_skips_or_runs(capsys):
    """Without a GPU the conv suite says it skipped; with one it runs (quick)."""
    from benchmarks import conv as conv_bench
    assert conv_bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out or "checks:" in out


def test_fusion_benchmark_skips_or_runs(capsys):
    """Without a GPU the fusion suite says it skipped; with one it runs (quick)."""
    from benchmarks import fusion
    assert fusion.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out or "of copy" in out


def test_train_benchmark_small(capsys):
    """On a machine without a GPU the default run skips with a message; with
    ``--handler numpy`` the whole code path runs on tiny models."""
    assert train_bench.main(["--small", "--reps", "2"]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out or "samples / s" in out
    assert train_bench.main(["--handler", "numpy", "--small", "--reps", "2"]) == 0
    out = capsys.readouterr().out
    for word in ("NumpyHandler", "gemm", "elementwise", "sum_t", "update"):
        assert word in out


def test_gpt_demo_learns_and_saves(tmp_path, capsys):
    """The GPT demo on NumPy: a short run learns below the uniform guess's
    loss, samples and saves a model that loads into a fresh network."""
    import numpy as np

    from examples import gpt
    from handlers import NumpyHandler
    path = tmp_path / "gpt.safetensors"
    rc = gpt.main(["--handler", "numpy", "--steps", "150", "--save", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "held-out loss" in out and out.count("'The ") == 3
    text, chars = gpt.load_text()
    blocks, width, heads, context, _, _ = gpt.SIZES["cpu"]
    net = gpt.build(NumpyHandler(np.float32), len(chars), blocks, width, heads, context, 1)
    net.load(str(path))
