"""The optional C extension of streamhandlers; the metadata is in pyproject.toml."""
from setuptools import Extension, setup

setup(
    # The C path to the CUDA driver and cuBLAS (see handlers/cuda/kernel_loader.py).
    # It needs only a C compiler and Python's headers, no CUDA; where it cannot
    # be built the install goes on (NumpyHandler does not use it).
    ext_modules=[Extension("handlers.cuda._launch",
                           ["handlers/cuda/_launch.c", "handlers/cuda/_one_call.c",
                            "handlers/cuda/_driver.c", "handlers/cuda/_cudnn.c"],
                           depends=["handlers/cuda/_launch.h"], optional=True)],
)
