"""Packaging for streamhandlers (import names ``handlers`` and ``layers``)."""
from pathlib import Path

from setuptools import Extension, setup

setup(
    name="streamhandlers",
    version="0.1.0",
    description="Write neural-network layers once; run them on NumPy or CUDA "
                "with resident parameters, device-side updates and stream groups.",
    long_description=Path(__file__).with_name("README.rst").read_text(encoding="utf-8"),
    long_description_content_type="text/x-rst",
    packages=["handlers", "layers"],
    package_data={"handlers": ["kernels/*.cu", "kernels/*.cuh"]},
    # The C kernel launcher (see handlers/kernel_loader.py).  It needs only a C
    # compiler and Python's headers, no CUDA; where it cannot be built the
    # install goes on and kernels launch through pycuda.
    ext_modules=[Extension("handlers._launch", ["handlers/_launch.c", "handlers/_one_call.c"],
                           depends=["handlers/_launch.h"], optional=True)],
    python_requires=">=3.10",
    install_requires=["numpy>=1.24"],
    extras_require={
        "test": ["pytest", "hypothesis", "tqdm", "scikit-learn", "matplotlib"],
        # scikit-cuda imports pkg_resources, which setuptools dropped after 80.
        "gpu": ["pycuda>=2026.1", "scikit-cuda==0.5.3", "setuptools<81"],
        "nvmath": ["nvmath-python"],
        "docs": ["sphinx"],
        "examples": ["matplotlib", "tqdm", "scikit-learn"],
    },
)
