"""Numbers the host and the kernels or the C extension must agree on, each
decided in one place.

* The launch constants (``BLOCK``, ``MID_BLOCK``, ``SUM_UNROLL``, ...) are
  ``handlers/cuda/launch.py``'s; the kernels read them from
  ``kernels/launch_constants.cuh``, which ``python -m handlers.generate``
  writes from there, and which the preprocessor shows them as.
* The GEMM kinds and cuBLAS's type numbers are the extension's
  (``_launch.h``, ``_launch.c``); ``handlers/cuda/blas.py`` reads them.

Runs on a CPU.
"""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from handlers import generate
from handlers.cuda import launch

KERNELS = Path(launch.HEADER).parent
CXX = shutil.which("g++") or shutil.which("clang++")
#: the header's macro -> the Python constant it copies
MACROS = {"SH_BLOCK": launch.BLOCK, "SH_MID_BLOCK": launch.MID_BLOCK,
          "SH_SUM_UNROLL": launch.SUM_UNROLL, "SH_PICK_UNROLL": launch.PICK_UNROLL,
          "SH_THREAD_ROW": launch.THREAD_ROW, "SH_THREAD_UNROLL": launch.THREAD_UNROLL,
          "SH_SHORT_ROW": launch.SHORT_ROW, "SH_LANE_UNROLL": launch.LANE_UNROLL,
          "SH_ROWS_PER_BLOCK": launch.ROWS_PER_BLOCK,
          "SH_MAX_BLOCKS_PER_SM": launch.MAX_BLOCKS_PER_SM}


def test_the_header_is_generated_and_up_to_date():
    """``python -m handlers.generate`` writes the header, and the checked-in
    one is what launch.py gives (regenerating changes nothing)."""
    assert (launch.HEADER, launch.header_source) in generate.FILES
    assert Path(launch.HEADER).read_text() == launch.header_source(), (
        f"{launch.HEADER} is out of date: run python -m handlers.generate")


def test_the_header_holds_the_python_constants():
    defined = dict(re.findall(r"^#define (SH_\w+) (\d+)$", launch.header_source(), re.M))
    assert {name: int(value) for name, value in defined.items()} == MACROS


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler to preprocess the kernels")
def test_the_kernels_see_the_python_constants():
    """What a kernel source sees through common.cuh (kernels/ on the
    include path, as kernel_loader.compile_source compiles them)."""
    probe = '#include "common.cuh"\n' + " ".join(f"{name.lower()}=({name})" for name in MACROS)
    cmd = [CXX, "-E", "-P", "-x", "c++", "-std=c++17", "-DSH_HOST_PREPROCESS",
           "-I", str(KERNELS), "-"]
    text = subprocess.run(cmd, input=probe, capture_output=True, text=True,
                          check=True).stdout
    for name, value in MACROS.items():
        assert f"{name.lower()}=({value})" in text, name


@pytest.mark.parametrize("source,literal", [
    ("reduce.cu", "__launch_bounds__(256)"), ("reduce.cu", "__launch_bounds__(1024)"),
    ("reduce.cu", "[256 * V]"), ("reduce.cu", "#define SH_SUM_UNROLL"),
    ("reduce.cu", "#define SH_PICK_UNROLL"),
    ("layout.cu", "k += 8")])
def test_kernels_name_the_constants_instead_of_copying_them(source, literal):
    assert literal not in (KERNELS / source).read_text(), (source, literal)


def test_generate_writes_only_what_is_out_of_date(tmp_path, monkeypatch, capsys):
    path = tmp_path / "generated.txt"
    monkeypatch.setattr(generate, "FILES", ((str(path), lambda: "text\n"),))
    generate.main()
    assert capsys.readouterr().out == f"wrote {path}\n" and path.read_text() == "text\n"
    generate.main()
    assert capsys.readouterr().out == ""


def test_blas_takes_the_extensions_abi_numbers():
    _launch = pytest.importorskip("handlers.cuda._launch",
                                  reason="handlers.cuda._launch is not built")
    from handlers.cuda import blas

    # The numbers of cuBLAS's and CUDA's headers (cublas_api.h, library_types.h).
    assert (_launch.CUDA_R_32F, _launch.CUDA_R_16F, _launch.CUDA_R_16BF) == (0, 2, 14)
    assert (_launch.CUBLAS_COMPUTE_32F, _launch.CUBLAS_GEMM_DEFAULT) == (68, -1)
    kinds = [_launch.GEMM_FLOAT, _launch.GEMM_DOUBLE, _launch.GEMM_BF16, _launch.GEMM_F16,
             _launch.GEMM_BF16_TO_F32, _launch.GEMM_F16_TO_F32]
    assert kinds == list(range(6))   # the range _launch.gemm accepts
    assert blas.KINDS == dict(zip(("f32", "f64", "bf16", "f16"), kinds))
    assert blas._F32_KIND == {_launch.GEMM_BF16: _launch.GEMM_BF16_TO_F32,
                              _launch.GEMM_F16: _launch.GEMM_F16_TO_F32}
    assert blas._HALF_TYPE == {_launch.GEMM_BF16: _launch.CUDA_R_16BF,
                               _launch.GEMM_F16: _launch.CUDA_R_16F}
    assert (blas._COMPUTE_32F, blas._GEMM_DEFAULT) == (68, -1)
    assert set(blas._ENTRY) == set(blas.KINDS.values())
