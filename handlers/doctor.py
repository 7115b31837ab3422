"""``python -m handlers.doctor``: what this machine has for streamhandlers,
and which handlers and features work on it.

It reports the NVIDIA driver and GPUs, the CUDA toolkit as pycuda's build
would find it (the check that the ``gpu`` extra's install runs first:
:mod:`handlers.toolkit`), cuDNN and NCCL, the optional Python packages, the
compiled extensions, and then what works: NumpyHandler always; PyCudaHandler
where one can be constructed and run an op; bfloat16 with ml_dtypes; several
processes with mpi4py (and nccl4py on the GPU); checkpoints with safetensors.

Each package and library is tried in a child process of its own, all at
once and each with a time limit, so that one that hangs or crashes on import
(a broken CUDA install can do either) is reported, not fatal, and the whole
run takes seconds.  The exit status is 0; with ``--gpu`` it is 1 when
PyCudaHandler cannot work here (after the report is printed).
"""
import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from . import toolkit

#: seconds a child probe may take (a first kernel compile by nvcc included)
PROBE_TIMEOUT = 120
#: the directory holding this ``handlers`` package: the children import it from there
ROOT = str(Path(__file__).resolve().parents[1])
_MARK = "@@doctor@@"   # starts the child's result line, whatever else it prints

# A child probe: BODY sets `info` (a short string) or raises; the last line
# that starts with _MARK carries the outcome as JSON.
_TEMPLATE = """
import json, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {root!r})
try:
{body}
    result = {{"ok": True, "info": info}}
except BaseException as e:
    result = {{"ok": False, "info": f"{{type(e).__name__}}: {{e}}".strip()}}
print({mark!r} + json.dumps(result), flush=True)
"""


@dataclass(frozen=True)
class Package:
    """An optional Python package: its distribution name, the module the
    project imports from it, and extra probe code that sets ``info``."""

    label: str
    distribution: str
    module: str
    info: str = "info = ''"


PACKAGES = (
    Package("pycuda", "pycuda", "pycuda.driver",
            "info = 'built for CUDA ' + '.'.join(map(str, m.get_version()))"),
    # the only scikit-cuda module PyCudaHandler uses (blas="scikit-cuda")
    Package("scikit-cuda", "scikit-cuda", "skcuda.cublas"),
    Package("nvmath-python", "nvmath-python", "nvmath.bindings.cublas"),
    Package("mpi4py", "mpi4py", "mpi4py.MPI",
            "info = m.Get_library_version().strip().splitlines()[0].strip()"),
    Package("nccl4py", "nccl4py", "nccl.core"),
    Package("ml_dtypes", "ml_dtypes", "ml_dtypes"),
    Package("safetensors", "safetensors", "safetensors.numpy"),
)

# cuDNN and NCCL, each looked for where the library looks: cuDNN where the
# handler's conv2d ops load it (convolution.cudnn_paths), NCCL in the
# nvidia-nccl wheel's package directory first, then as the soname.
_CUDNN_PATHS = """
    from handlers.cuda.convolution import cudnn_paths
    tried = cudnn_paths()"""
_NCCL_PATHS = """
    from handlers.toolkit import wheel_library_paths
    tried = wheel_library_paths("nccl", "libnccl.so.2")"""
_LIBRARY = """
    import ctypes, os
{paths}
    errors = []
    for path in tried:
        if os.path.sep in path and not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(str(e))
    else:
        raise OSError("; ".join(errors) or "not found")
{version}
    info = f"{{version}} ({{path}})"
"""
_CUDNN_VERSION = """
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    v = lib.cudnnGetVersion()
    version = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" """
_NCCL_VERSION = """
    n = ctypes.c_int(0)
    lib.ncclGetVersion(ctypes.byref(n))
    v = n.value
    version = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" """
LIBRARIES = {
    "cuDNN": _LIBRARY.format(paths=_CUDNN_PATHS, version=_CUDNN_VERSION),
    "NCCL": _LIBRARY.format(paths=_NCCL_PATHS, version=_NCCL_VERSION),
}

# What a user would do first: construct a handler, then run one op (its
# first kernel is compiled by nvcc, through pycuda).
_PYCUDA_HANDLER = """
    import numpy as np
    from handlers import PyCudaHandler
    h = PyCudaHandler(np.float32)
    x = h.create_from_numpy(np.arange(4, dtype=np.float32).reshape(2, 2))
    out = h.zeros((2, 2))
    h.add_tt(x, x, out)
    got = h.get_numpy_copy(out).ravel().tolist()
    if got != [0.0, 2.0, 4.0, 6.0]:
        raise RuntimeError(f"add_tt of [0, 1, 2, 3] with itself gave {got}")
    info = "constructed, and add_tt ran"
"""


def _package_body(p):
    return (f"    import importlib\n    m = importlib.import_module({p.module!r})\n"
            f"    {p.info}\n")


def start_probes(probes):
    """Start each probe (name -> indented body that sets ``info``) in a child
    Python; name -> the running child (for :func:`collect_probes`)."""
    children = {}
    for name, body in probes.items():
        code = _TEMPLATE.format(root=ROOT, body=body, mark=_MARK)
        children[name] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                          text=True, errors="replace")
    return children


def collect_probes(children, timeout=PROBE_TIMEOUT):
    """name -> ``(ok, text)`` of each child of :func:`start_probes`.  A child
    that crashes, hangs past ``timeout`` seconds (all of them together) or
    prints no result gives ``ok`` False and why."""
    deadline = time.monotonic() + timeout
    results = {}
    for name, child in children.items():
        try:
            out, err = child.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            results[name] = (False, f"no answer within {timeout} s")
            continue
        lines = [ln for ln in out.splitlines() if ln.startswith(_MARK)]
        if lines:
            result = json.loads(lines[-1][len(_MARK):])
            results[name] = (result["ok"], result["info"])
        else:
            tail = (err.strip().splitlines() or [""])[-1]
            results[name] = (False, f"the child process died (exit {child.returncode}) {tail}"
                             .rstrip())
    return results


def run_probes(probes, timeout=PROBE_TIMEOUT):
    """Run the probes (see :func:`start_probes`) all at once; their results."""
    return collect_probes(start_probes(probes), timeout)


def installed_version(distribution):
    """The installed version of ``distribution``, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


#: The compiled extensions (both optional) and what each one is for.
EXTENSIONS = (("handlers.cuda._launch", "PyCudaHandler's path to the driver"),
              ("handlers._hostcopy", "big staging copies on threads without the GIL"))


def extension_state(name):
    """``(built, text)`` for the compiled extension ``name``."""
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        return False, f"not built ({e}): python setup.py build_ext --inplace, or reinstall"
    return True, f"built ({module.__file__})"


def find_mpiexec():
    """The MPI launcher: the one beside this interpreter (the mpich wheel's),
    else mpiexec or mpirun on PATH; None if there is none."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec") or shutil.which("mpirun")


def gather():
    """Everything the report says, as a dict (the probes run here)."""
    probes = {p.label: _package_body(p) for p in PACKAGES}
    probes.update(LIBRARIES)
    probes["PyCudaHandler"] = _PYCUDA_HANDLER
    started = time.monotonic()
    # The children run while this process asks the driver and the toolkit.
    children = start_probes(probes)
    driver = toolkit.probe_driver()
    found = toolkit.find_toolkit()
    facts = {
        "driver": driver,
        "release": toolkit.driver_release() if driver.library else None,
        "toolkit": found,
        "pieces": toolkit.pieces(found, driver),
        "extensions": {name: extension_state(name) for name, _ in EXTENSIONS},
        "mpiexec": find_mpiexec(),
        "kernel_cache": kernel_cache_state(),
        "versions": {p.label: installed_version(p.distribution) for p in PACKAGES},
    }
    facts["probes"] = collect_probes(children)
    facts["seconds"] = time.monotonic() - started
    return facts


def kernel_cache_state():
    """``(folder, binaries, bytes)`` of the compiled kernels' disk cache
    (``kernel_loader.kernel_cache_dir``; 0 and 0 where the folder does not
    exist yet), or None where it is turned off."""
    from .cuda.kernel_loader import CACHE_SUFFIX, kernel_cache_dir
    folder = kernel_cache_dir()
    if folder is None:
        return None
    try:
        files = [e for e in os.scandir(folder) if e.name.endswith(CACHE_SUFFIX) and e.is_file()]
    except OSError:
        files = []
    return folder, len(files), sum(e.stat().st_size for e in files)


# --- the report -----------------------------------------------------------------

_WIDTH = 24


def _row(label, text):
    # One row: the label, then the text, wrapped under itself at spaces only
    # (paths stay whole).
    return textwrap.fill(" ".join(text.split()), 100, initial_indent=f"  {label:<{_WIDTH}}",
                         subsequent_indent=" " * (_WIDTH + 2), break_long_words=False,
                         break_on_hyphens=False)


def _gib(n):
    return f"{n / 2**30:.1f} GiB"


def driver_lines(facts):
    """The driver and GPU rows."""
    d = facts["driver"]
    if d.usable:
        head = f"{d.library}"
    else:
        head = f"not usable: {d.error}"
    lines = [_row("driver", head)]
    if facts["release"] or d.cuda_version:
        release = facts["release"] or "not read (no /proc/driver/nvidia/version, no nvidia-smi)"
        cuda = (f"; runs CUDA up to {d.cuda_version[0]}.{d.cuda_version[1]}"
                if d.cuda_version else "")
        lines.append(_row("driver version", release + cuda))
    for g in d.gpus:
        lines.append(_row(f"GPU {g.index}", f"{g.name}, {_gib(g.memory_bytes)}, compute "
                          f"capability {g.capability[0]}.{g.capability[1]}"))
    if not d.gpus:
        lines.append(_row("GPUs", "none seen"))
    return lines


def toolkit_lines(facts):
    """The toolkit rows: nvcc, the root pycuda would take, the headers."""
    t = facts["toolkit"]
    nvcc, *headers = facts["pieces"][1:]
    lines = [_row(nvcc.name, ("" if nvcc.found else "MISSING: ") + nvcc.detail)]
    if t.root:
        lines.append(_row("toolkit root", f"{t.root} (the directory above nvcc's bin/, where "
                          "pycuda looks)" if not t.config.get("CUDA_ROOT")
                          else f"{t.root} (CUDA_ROOT in pycuda's config file)"))
    for p in headers:
        lines.append(_row(p.name, ("" if p.found else "MISSING: ") + p.detail))
    if t.config:
        settings = ", ".join(f"{k}={v!r}" for k, v in sorted(t.config.items()))
        lines.append(_row("pycuda config files", settings))
    cache = facts["kernel_cache"]
    lines.append(_row("kernel cache", "off (STREAMHANDLERS_KERNEL_CACHE is empty): every process "
                      "compiles its kernels" if cache is None else
                      f"{cache[0]}: {cache[1]} compiled module{'' if cache[1] == 1 else 's'}, "
                      f"{cache[2] / 2**20:.1f} MiB "
                      "(STREAMHANDLERS_KERNEL_CACHE moves it; safe to delete)"))
    ignored = [v for v in ("CUDA_ROOT", "CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    if ignored:
        lines.append(_row("note", f"{', '.join(ignored)} set in the environment: pycuda's build "
                          "does not read it (it goes by nvcc on PATH)"))
    return lines


def package_lines(facts):
    """One row per optional package, then the compiled extensions."""
    lines = []
    for p in PACKAGES:
        version = facts["versions"][p.label]
        ok, text = facts["probes"][p.label]
        if ok:
            lines.append(_row(p.label, f"{version or 'present'}" + (f", {text}" if text else "")))
        elif version is None and "ModuleNotFoundError" in text:
            lines.append(_row(p.label, "not installed"))
        else:
            lines.append(_row(p.label, f"{version or 'present'}, but `import {p.module}` "
                              f"fails: {text}"))
    for name, use in EXTENSIONS:
        built, text = facts["extensions"][name]
        lines.append(_row(name, text if built else f"{text}; {use}"))
    return lines


def library_lines(facts):
    """cuDNN and NCCL."""
    lines = []
    for name, use in (("cuDNN", "9, for conv2d on the GPU"), ("NCCL", "for several GPUs")):
        ok, text = facts["probes"][name]
        lines.append(_row(name, text if ok else f"not found ({use}): {text}"))
    return lines


def works(facts):
    """``(feature, yes, text)`` for each handler and feature."""
    probes = facts["probes"]
    imports = {p.label: probes[p.label][0] for p in PACKAGES}
    gpu_ok, gpu_text = probes["PyCudaHandler"]
    out = [("NumpyHandler", True, "yes"),
           ("PyCudaHandler", gpu_ok, "yes: " + gpu_text if gpu_ok else "no: " + gpu_text)]
    for blas, label in (("scikit-cuda", "scikit-cuda"), ("nvmath", "nvmath-python")):
        extra = "gpu" if blas == "scikit-cuda" else "nvmath"
        ok = gpu_ok and imports[label]
        why = ("yes" if ok else "no: needs PyCudaHandler" if not gpu_ok
               else f"no: needs {label} (pip install -e '.[{extra}]')")
        out.append((f'  blas="{blas}"', ok, why))
    cudnn_ok = probes["cuDNN"][0]
    out.append(("  conv2d", gpu_ok and cudnn_ok,
                "yes" if gpu_ok and cudnn_ok else "no: needs PyCudaHandler" if not gpu_ok
                else "no: needs cuDNN 9 (pip install nvidia-cudnn-cu13, or -cu12 for CUDA 12)"))
    out.append(("float16", True, "yes (NumPy's)"))
    out.append(("bfloat16", imports["ml_dtypes"], "yes (ml_dtypes)" if imports["ml_dtypes"]
                else "no: needs ml_dtypes (pip install -e '.[half]')"))
    out.append(("checkpoints", imports["safetensors"], "yes (safetensors)"
                if imports["safetensors"] else "no: needs safetensors (pip install safetensors)"))
    mpiexec = facts["mpiexec"]
    cpu_mp = imports["mpi4py"] and mpiexec is not None
    out.append(("several processes", cpu_mp,
                f"yes with NumpyHandler (mpi4py, {mpiexec})" if cpu_mp
                else "no: needs mpi4py and an MPI launcher (pip install -e '.[mpi]')"))
    gpu_mp = cpu_mp and gpu_ok and imports["nccl4py"] and probes["NCCL"][0]
    out.append(("  with PyCudaHandler", gpu_mp, "yes (nccl4py)" if gpu_mp else
                "no: needs PyCudaHandler, mpi4py and nccl4py (pip install 'nccl4py[cu13]' "
                "or 'nccl4py[cu12]', matching the driver)"))
    return out


def report(facts):
    """The whole plain-text report, as lines."""
    lines = [f"streamhandlers doctor: Python {platform.python_version()} ({sys.executable}), "
             f"{platform.system()} {platform.machine()}, handlers from {ROOT}", ""]
    lines += ["NVIDIA driver and GPUs"] + driver_lines(facts) + [""]
    lines += ["CUDA toolkit, as pycuda's build would find it"] + toolkit_lines(facts) + [""]
    lines += ["CUDA libraries"] + library_lines(facts) + [""]
    lines += ["Python packages (each imported in a child process)"] + package_lines(facts) + [""]
    lines += ["What works here"]
    lines += [_row(name, text) for name, _, text in works(facts)]
    lines.append("")
    message = toolkit.missing_message(facts["pieces"], doctor_hint=False)
    if message:
        lines += ["pip install -e '.[gpu]' would stop at its preflight, with:", ""]
        lines += ["  " + ln if ln else "" for ln in message.splitlines()]
    else:
        lines.append("pip install -e '.[gpu]': every piece pycuda's build needs is here.")
    lines += ["", f"(checked in {facts['seconds']:.1f} s)"]
    return lines


def main(argv=None):
    """The command: print the report; the exit status (see the module)."""
    parser = argparse.ArgumentParser(prog="python -m handlers.doctor",
                                     description="What this machine has for streamhandlers, "
                                     "and which handlers and features work on it.")
    parser.add_argument("--gpu", action="store_true",
                        help="exit with status 1 when PyCudaHandler cannot work here")
    args = parser.parse_args(argv)
    # The report comes at the end; say why it may take a while.
    print(f"checking, each piece in a child process (at most {PROBE_TIMEOUT} s: on a "
          "fresh machine PyCudaHandler's first kernels compile with nvcc, which can take a "
          "minute or more, cached after) ...", file=sys.stderr, flush=True)
    facts = gather()
    print("\n".join(report(facts)), flush=True)
    gpu_ok, gpu_text = facts["probes"]["PyCudaHandler"]
    if args.gpu and not gpu_ok:
        print(f"\n--gpu: PyCudaHandler cannot work here: {gpu_text}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
