"""Compile the CUDA sources in ``handlers/kernels`` once per process.

Each ``.cu`` file is plain CUDA C++ (templates instantiated for float and
double behind ``extern "C"`` names ending in ``_f32``/``_f64``), so it also
compiles standalone with nvcc.  pycuda caches the binaries on disk, so a warm
start does not invoke nvcc again.
"""
import os

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
_modules = {}


def module(name):
    """Return the compiled pycuda module for ``kernels/<name>.cu``."""
    mod = _modules.get(name)
    if mod is None:
        from pycuda.compiler import SourceModule
        with open(os.path.join(KERNEL_DIR, name + ".cu")) as f:
            source = f.read()
        mod = SourceModule(source, no_extern_c=True, options=["-std=c++17"],
                           include_dirs=[KERNEL_DIR])
        _modules[name] = mod
    return mod


def function(file, name, suffix, arg_format):
    """Return kernel ``name + '_' + suffix`` from ``file``, prepared with
    ``arg_format`` (pycuda struct codes, e.g. ``"PPq"``)."""
    fn = module(file).get_function(f"{name}_{suffix}")
    fn.prepare(arg_format)
    return fn
