"""What pyproject.toml cannot express: the optional C extension and the extras."""
from pathlib import Path

from setuptools import Extension, setup

# The gpu extra's install preflight (see tools/gpu_preflight/pyproject.toml):
# a requirement on a local directory must be an absolute file:// URL, so it is
# made here, from this file's directory.  An sdist or copy without tools/
# gets the gpu extra without it.
PREFLIGHT = Path(__file__).resolve().parent / "tools" / "gpu_preflight"

EXTRAS = {
    # mpi4py and the mpich wheel (which brings mpiexec) run the data-parallel
    # tests on two processes of the CPU.
    "test": ["pytest", "pytest-timeout", "hypothesis", "tqdm", "scikit-learn", "matplotlib",
             "ml_dtypes>=0.5", "mpi4py", "mpich; sys_platform != 'win32'"],
    # bfloat16 arrays on the host are ml_dtypes.bfloat16 (float16 needs nothing extra)
    "half": ["ml_dtypes>=0.5"],
    # pycuda builds from source: it needs the whole CUDA toolkit (nvcc on PATH,
    # cuda.h and curand.h) to install and an NVIDIA driver to run.  The
    # preflight checks for all four before pip builds it (python -m
    # handlers.doctor runs the same check); see docs/getting_started.rst.
    # scikit-cuda imports pkg_resources, which setuptools dropped after 80.
    "gpu": ([f"streamhandlers-gpu-preflight @ {PREFLIGHT.as_uri()}"] if PREFLIGHT.is_dir()
            else []) + ["pycuda>=2026.1", "scikit-cuda==0.5.3", "setuptools<81"],
    "nvmath": ["nvmath-python"],
    # Several processes (mpirun): MPI for NumpyHandler; a PyCudaHandler also
    # needs nccl4py ('nccl4py[cu13]' or 'nccl4py[cu12]', matching the driver).
    "mpi": ["mpi4py", "mpich; sys_platform != 'win32'"],
    "docs": ["sphinx"],
    "examples": ["matplotlib", "tqdm", "scikit-learn"],
}

setup(
    extras_require=EXTRAS,
    # The C path to the CUDA driver and cuBLAS (see handlers/cuda/kernel_loader.py).
    # It needs only a C compiler and Python's headers, no CUDA; where it cannot
    # be built the install goes on (NumpyHandler does not use it).
    ext_modules=[Extension("handlers.cuda._launch",
                           ["handlers/cuda/_launch.c", "handlers/cuda/_one_call.c",
                            "handlers/cuda/_driver.c", "handlers/cuda/_cudnn.c"],
                           depends=["handlers/cuda/_launch.h"], optional=True),
                 # The stager's big host copies, split across threads without the
                 # GIL (handlers/prefetch.py); optional too: without it Python
                 # threads split them.
                 Extension("handlers._hostcopy", ["handlers/_hostcopy.c"],
                           extra_compile_args=["-pthread"], extra_link_args=["-pthread"],
                           optional=True)],
)
