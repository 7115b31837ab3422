"""The test kit as users meet it: ``examples/outside_project`` (a package
with one layer and one fused op, and its tests written with the kit) run as
a project outside this repository, and the kit's failures naming what is
wrong when a bug is planted in that layer or op."""
import re
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import numpy as np
import pytest

from handlers import fused_op
from handlers.testing import check_fused_op

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "outside_project"


def _installed():
    """True if streamhandlers is installed here (its pytest11 entry point too)."""
    try:
        distribution("streamhandlers")
        return True
    except PackageNotFoundError:
        return False


def run_outside(tmp_path, *args, plant=None):
    """Copy the outside project to ``tmp_path`` (applying ``plant``, a pair
    (old line, new lines) of mylayers/__init__.py) and run pytest there in
    a fresh process; returns (exit code, output).  Installed, the plugin
    comes from the entry point alone; from a plain checkout (the GPU
    machine), from ``-p handlers.testing`` with this repository on the path."""
    dest = tmp_path / "project"
    shutil.copytree(PROJECT, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if plant is not None:
        src = dest / "mylayers" / "__init__.py"
        text = src.read_text()
        assert text.count(plant[0]) == 1, plant[0]
        src.write_text(text.replace(plant[0], plant[1]))
    extra, env = [], None
    if not _installed():
        import os
        extra = ["-p", "handlers.testing"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *extra, *args], cwd=dest, capture_output=True, text=True,
                         timeout=240, env=env)
    return run.returncode, run.stdout + run.stderr


@pytest.mark.timeout(300)
def test_outside_project_runs_on_every_handler(tmp_path):
    """No conftest there: the plugin gives its tests the handler and rng
    fixtures over every configuration this machine builds (the others skip
    with their reason), and its summary lists them."""
    code, out = run_outside(tmp_path)
    assert code == 0, out
    assert "streamhandlers handlers" in out and "numpy-f32: NumpyHandler" in out, out
    ran = re.search(r"(\d+) passed", out)
    assert ran and int(ran.group(1)) >= 6, out       # 3 tests x numpy f32, f64 at least
    assert "base seed" in out


PLANTS = {
    "wrong-sign-dw": (('        h.mult_tt(dy, self._x, buf.t)\n',
                       '        h.mult_tt(dy, self._x, buf.t)\n'
                       '        h.mult_st(-1.0, buf.t, buf.t)\n'), "dL/dw"),
    "no-bias-gradient": (('        h.sum_t(dy, 0, self.grads["b"])'
                          '             # dL/db = sum over rows of dy\n', ''), "dL/db"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("plant", list(PLANTS))
def test_planted_bug_fails_naming_the_parameter(tmp_path, plant):
    """A wrong sign in dL/dw, a bias gradient never written: the layer's
    test fails, and the message names the parameter and its worst element."""
    change, grad = PLANTS[plant]
    code, out = run_outside(tmp_path, "-k", "gradients", "--handler", "numpy-f64",
                            plant=change)
    assert code == 1, out
    assert f"FeatureAffine(6) {grad}: relative error" in out, out
    assert "worst element (0, " in out and "central difference" in out, out


def test_fused_op_check_names_the_output_and_worst_element(handler, rng):
    """check_fused_op against a wrong reference fails naming the output;
    against the right one it passes."""
    op = fused_op("kit_softsign_pair", inputs="x", outputs="y z",
                  body="y = x / (1 + abs(x)); z = y * y")
    right = lambda x: (x / (1 + np.abs(x)), (x / (1 + np.abs(x))) ** 2)   # noqa: E731
    check_fused_op(handler, op, right, (5, 9), rng)
    wrong = lambda x: (x / (1 + np.abs(x)), (x / (1 + np.abs(x))) ** 3)   # noqa: E731
    with pytest.raises(AssertionError, match=r"kit_softsign_pair output z .*worst element"):
        check_fused_op(handler, op, wrong, (5, 9), rng)


@pytest.mark.parametrize("error, skips", [
    (RuntimeError("cuInit failed: no CUDA-capable device is detected"), True),
    ("CUDA_ERROR_NO_DEVICE", True),
    ("CUDA_ERROR_INSUFFICIENT_DRIVER", True),
    ("CUDA_ERROR_INVALID_IMAGE", False),      # a kernel module the driver refused
    ("CUDA_ERROR_OUT_OF_MEMORY", False)])
def test_a_gpu_that_is_there_but_broken_fails_rather_than_skips(monkeypatch, error, skips):
    """The kit skips a GPU configuration where this machine has no GPU to
    use, and fails where the driver refuses something of a GPU that is there
    (on 2026-11-28 fifteen test processes read a kernel binary half written
    by another, and a whole file's GPU tests became skips)."""
    import handlers
    from handlers import testing
    from handlers.cuda.kernel_loader import CudaError
    if isinstance(error, str):
        error = CudaError("cuModuleLoadData", error, 1)

    def build(**kwargs):
        raise error
    monkeypatch.setattr(handlers, "PyCudaHandler", build, raising=False)
    gpu_id = next(i for i, (backend, _) in testing.CONFIGS.items() if backend != "numpy")
    if skips:
        with pytest.raises(pytest.skip.Exception, match="no usable GPU"):
            testing._construct(gpu_id)
    else:
        with pytest.raises(CudaError) as raised:
            testing._construct(gpu_id)
        assert raised.value is error
