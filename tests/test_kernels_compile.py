"""Every CUDA source in handlers/cuda/kernels compiles on its own with nvcc.

This catches syntax and template errors on machines without a GPU; the
kernels' results are tested through the handler tests where a GPU exists.
"""
import shutil
import subprocess
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "handlers" / "cuda" / "kernels"
SOURCES = sorted(KERNELS.glob("*.cu"))
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_kernel_compiles(source, tmp_path):
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-I", str(KERNELS), "-c",
           "-o", str(tmp_path / (source.stem + ".o")), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, (
        f"nvcc failed on {source.name} (exit {result.returncode}):\n{result.stderr}")


def test_kernel_sources_exist():
    names = {p.name for p in SOURCES}
    for expected in ("elementwise.cu", "rows.cu", "random.cu"):
        assert expected in names
