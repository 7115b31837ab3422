"""What the ``gpu`` extra needs from the machine, found the way pycuda finds it.

pycuda has no Linux wheel: ``pip install -e '.[gpu]'`` compiles it, and that
takes four pieces, checked here: an NVIDIA driver (to run anything), ``nvcc``
on ``PATH``, and the toolkit headers ``cuda.h`` and ``curand.h``.  Where one is
missing, pycuda's build fails after a minute or more of compiler output;
:func:`preflight` names every missing piece at once, and how to get it.

Where pycuda looks (its setup.py and aksetup_helper.py, release 2026.1): the
toolkit root is the directory above the first ``nvcc`` on ``PATH``, taken as
found (a link or a wrapper script is not followed), unless an aksetup config
file (``/etc/aksetup-defaults.py``, then ``~/.aksetup-defaults.py``) sets
``CUDA_ROOT``; the headers come from that root's ``include/`` unless the file
sets ``CUDA_INC_DIR``, and from the C++ compiler's own search path (``CPATH``,
``CPLUS_INCLUDE_PATH``, ``/usr/local/include``, ``/usr/include``).  pycuda
reads no environment variable for the toolkit: ``CUDA_ROOT``, ``CUDA_HOME`` and
``CUDA_PATH`` in the environment change nothing, so here they only suggest
where a toolkit may be.

The driver is asked through ctypes (``cuInit``, ``cuDriverGetVersion``,
``cuDeviceGetName``), without pycuda.

Standard library only, and no import from the ``handlers`` package: the
preflight's build backend (``tools/gpu_preflight``) loads this file by path,
before numpy or anything else is installed.  ``python -m handlers.doctor``
reports the same findings and more.
"""
import ast
import ctypes
import glob
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

#: The environment variable that skips the preflight: ``driver`` skips only the
#: driver check (building on a machine without a GPU, a container image say);
#: ``1`` skips every check.
SKIP_ENV = "STREAMHANDLERS_SKIP_GPU_PREFLIGHT"

#: The pieces, in the order a message names them.
DRIVER, NVCC, CUDA_H, CURAND_H = "NVIDIA driver", "nvcc", "cuda.h", "curand.h"

#: CUdevice_attribute's compute capability (cuda.h)
_CC_MAJOR, _CC_MINOR = 75, 76

#: The C++ compiler's own header directories (GCC's and Clang's on Linux,
#: where pycuda builds from source).
SYSTEM_INCLUDE_DIRS = () if sys.platform == "win32" else ("/usr/local/include", "/usr/include")

#: Where toolkits are usually installed (glob patterns): remedies suggest them.
USUAL_ROOTS = () if sys.platform == "win32" else ("/usr/local/cuda", "/usr/local/cuda-*",
                                                   "/opt/cuda")

# Seconds a command may take before it counts as not answering: nvcc --version
# answers in milliseconds, so this only guards against a hung wrapper.
_COMMAND_TIMEOUT = 20


@dataclass(frozen=True)
class Gpu:
    """One GPU the driver sees."""

    index: int
    name: str
    memory_bytes: int
    capability: tuple


@dataclass(frozen=True)
class Driver:
    """What the CUDA driver library reports.

    ``library`` is the file that was loaded (None: none could be);
    ``cuda_version`` the newest CUDA the driver runs, as (major, minor);
    ``error`` why the driver is unusable (None when it sees a GPU).
    """

    library: str | None
    cuda_version: tuple | None
    gpus: tuple
    error: str | None

    @property
    def usable(self):
        """True if the driver loaded, initialised and sees at least one GPU."""
        return self.error is None


@dataclass(frozen=True)
class Toolkit:
    """The CUDA toolkit as pycuda's build would find it.

    ``root`` is the directory pycuda takes for the toolkit (None without nvcc
    and without a configured ``CUDA_ROOT``); ``include_dirs`` are the header
    directories pycuda passes to the compiler and ``compiler_dirs`` the ones
    the compiler searches by itself, after them; ``headers`` maps each header
    pycuda needs to where it was found (None: in neither).
    """

    nvcc: str | None
    nvcc_version: str | None
    nvcc_error: str | None
    root: str | None
    include_dirs: tuple
    compiler_dirs: tuple
    headers: dict
    config: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Piece:
    """One of the four pieces: whether it is there, where (or where it was
    looked for), and how to get it when it is missing."""

    name: str
    found: bool
    detail: str
    remedy: str = ""
    checked: bool = True


# --- the driver -------------------------------------------------------------


def driver_library_names():
    """The file names of the CUDA driver library on this platform."""
    if sys.platform == "win32":
        return ("nvcuda.dll",)
    if sys.platform == "darwin":
        return ()
    # The versioned name is the driver's own; the bare libcuda.so is also the
    # toolkit's link stub, which fails cuInit.
    return ("libcuda.so.1",)


def probe_driver(names=None):
    """Load the driver library and ask it for its version and GPUs
    (:class:`Driver`).  Never raises: whatever fails lands in ``error``."""
    names = driver_library_names() if names is None else tuple(names)
    if not names:
        return Driver(None, None, (), f"CUDA has no driver on this platform ({sys.platform})")
    lib, errors = None, []
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            errors.append(str(e))
    if lib is None:
        return Driver(None, None, (), "could not load " + " or ".join(names)
                      + (f" ({'; '.join(errors)})" if errors else ""))
    library = getattr(lib, "_name", names[0])
    try:
        return _ask_driver(lib, library)
    except (AttributeError, OSError, ValueError) as e:   # a library that is not the driver
        return Driver(library, None, (), f"{library} is not a usable CUDA driver ({e})")


def _ask_driver(lib, library):
    version = ctypes.c_int(0)
    cuda_version = None
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
        cuda_version = (version.value // 1000, version.value % 1000 // 10)
    rc = lib.cuInit(0)
    if rc:
        return Driver(library, cuda_version, (), f"cuInit failed: {_error_text(lib, rc)}")
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc:
        return Driver(library, cuda_version, (),
                      f"cuDeviceGetCount failed: {_error_text(lib, rc)}")
    gpus = tuple(_ask_gpu(lib, i) for i in range(count.value))
    error = None if gpus else "the driver sees no GPU"
    return Driver(library, cuda_version, gpus, error)


def _ask_gpu(lib, index):
    device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
    memory, major, minor = ctypes.c_size_t(0), ctypes.c_int(0), ctypes.c_int(0)
    lib.cuDeviceGet(ctypes.byref(device), index)
    lib.cuDeviceGetName(name, len(name), device)
    lib.cuDeviceTotalMem_v2(ctypes.byref(memory), device)
    lib.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, device)
    lib.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, device)
    return Gpu(index, name.value.decode(errors="replace"), memory.value,
               (major.value, minor.value))


def _error_text(lib, rc):
    # cuGetErrorName works before (and without) a successful cuInit.
    text = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(rc, ctypes.byref(text)) == 0 and text.value:
            return f"{text.value.decode()} ({rc})"
    except AttributeError:
        pass
    return f"CUresult {rc}"


def wheel_library_paths(package, soname):
    """Where a library that NVIDIA's pip wheels ship is looked for, in order:
    ``lib/soname`` in each directory of the ``nvidia.<package>`` package (the
    ``nvidia-<package>-cu*`` wheels) if it imports, then the plain ``soname``
    on the loader's path."""
    tried = []
    try:
        pkg = __import__(f"nvidia.{package}", fromlist=["__path__"])
        tried += [os.path.join(d, "lib", soname) for d in pkg.__path__]
    except ImportError:
        pass
    return tried + [soname]


def driver_release():
    """The NVIDIA driver's release (e.g. ``580.95.05``), or None: read from
    ``/proc/driver/nvidia/version`` where Linux has it, else from nvidia-smi."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as f:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", f.read())
        if found:
            return found.group(1)
    except OSError:
        pass
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


# --- the toolkit ------------------------------------------------------------


def pycuda_config_files(environ):
    """The aksetup config files pycuda's build reads, in the order it reads
    them (a later file's settings win)."""
    home = environ.get("HOME") or os.path.expanduser("~")
    files = [] if sys.platform == "win32" else ["/etc/aksetup-defaults.py"]
    return files + [os.path.join(home, ".aksetup-defaults.py")]


def read_pycuda_config(paths):
    """The settings of pycuda's aksetup config files that decide where it
    looks: ``CUDA_ROOT``, ``CUDA_INC_DIR`` and ``CUDA_ENABLE_CURAND``.  The
    files are Python assignments; only literal values are read (nothing is
    executed), and a file that cannot be read or parsed is passed over."""
    wanted = {"CUDA_ROOT", "CUDA_INC_DIR", "CUDA_ENABLE_CURAND"}
    config = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id in wanted):
                try:
                    config[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    if isinstance(config.get("CUDA_INC_DIR"), str):
        config["CUDA_INC_DIR"] = [config["CUDA_INC_DIR"]]
    return config


def find_nvcc(environ):
    """The first ``nvcc`` on the environment's ``PATH``, as pycuda's build
    finds it: the first directory holding a file of that name (its absolute
    path, links not followed), or None."""
    names = ("nvcc", "nvcc.exe") if sys.platform == "win32" else ("nvcc",)
    for directory in environ.get("PATH", "").split(os.pathsep):
        for name in names:
            path = os.path.join(directory, name)
            if os.path.exists(path):
                return os.path.abspath(path)
    return None


def nvcc_version(nvcc):
    """``(version, error)``: nvcc's release line (e.g. ``release 13.0,
    V13.0.88``) and None, or None and why ``nvcc --version`` did not answer."""
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                              timeout=_COMMAND_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"`{nvcc} --version` could not run: {e}"
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return None, f"`{nvcc} --version` failed (exit {proc.returncode}) {tail[0]}".rstrip()
    found = re.search(r"release [^\n]*", proc.stdout)
    return (found.group(0).strip() if found else proc.stdout.strip() or "unknown"), None


def compiler_include_dirs(environ):
    """The directories the C++ compiler searches by itself, after the ones
    pycuda passes: ``CPATH`` and ``CPLUS_INCLUDE_PATH``, then the system's."""
    dirs = []
    for var in ("CPATH", "CPLUS_INCLUDE_PATH"):
        dirs += [d for d in environ.get(var, "").split(os.pathsep) if d]
    return dirs + list(SYSTEM_INCLUDE_DIRS)


def find_toolkit(environ=None, config_files=None):
    """The toolkit pycuda's build would use (:class:`Toolkit`), for
    ``environ`` (default: this process's) and the aksetup files
    ``config_files`` (default: :func:`pycuda_config_files`)."""
    environ = os.environ if environ is None else environ
    paths = pycuda_config_files(environ) if config_files is None else config_files
    config = read_pycuda_config(paths)
    nvcc = find_nvcc(environ)
    version, error = nvcc_version(nvcc) if nvcc else (None, None)
    root = config.get("CUDA_ROOT") or (os.path.normpath(os.path.join(os.path.dirname(nvcc), ".."))
                                       if nvcc else None)
    include_dirs = tuple(config.get("CUDA_INC_DIR") or ([os.path.join(root, "include")]
                                                         if root else []))
    compiler_dirs = tuple(d for d in dict.fromkeys(compiler_include_dirs(environ))
                          if d not in include_dirs)
    # pycuda's switch CUDA_ENABLE_CURAND (on unless a config file turns it off)
    # is what makes it compile its cuRAND wrapper, and so need curand.h.
    names = (CUDA_H, CURAND_H) if config.get("CUDA_ENABLE_CURAND", True) else (CUDA_H,)
    headers = {name: _first_file(name, include_dirs + compiler_dirs) for name in names}
    return Toolkit(nvcc, version, error, root, include_dirs, compiler_dirs, headers, config)


def _first_file(name, dirs):
    for d in dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path):
            return path
    return None


def candidate_roots(environ, toolkit=None):
    """Toolkits elsewhere on this machine, to suggest in a remedy: the
    directories named by ``CUDA_HOME``, ``CUDA_PATH`` and ``CUDA_ROOT``, the
    toolkit a linked ``nvcc`` leads to, and the usual install places; each
    that has ``bin/nvcc``, with the headers it holds, as ``(root, headers)``."""
    places = [environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    if toolkit is not None and toolkit.nvcc:
        places.append(os.path.dirname(os.path.dirname(os.path.realpath(toolkit.nvcc))))
    places += [p for pattern in USUAL_ROOTS for p in sorted(glob.glob(pattern), reverse=True)]
    found, seen = [], set()
    for place in places:
        if not place or not os.path.isdir(place):
            continue
        key = os.path.realpath(place)
        if key in seen or (toolkit is not None and toolkit.root
                           and key == os.path.realpath(toolkit.root)):
            continue
        seen.add(key)
        if _first_file("nvcc", [os.path.join(place, "bin")]) or \
                _first_file("nvcc.exe", [os.path.join(place, "bin")]):
            include = os.path.join(place, "include")
            found.append((place, tuple(h for h in (CUDA_H, CURAND_H)
                                       if os.path.isfile(os.path.join(include, h)))))
    return found


# --- the four pieces and the message ------------------------------------------


def pieces(toolkit, driver, environ=None):
    """The four pieces (:class:`Piece`), in message order, each with where it
    was found or looked for and, when missing, how to get it (``environ``
    names toolkits elsewhere for the remedies: :func:`candidate_roots`)."""
    return [driver_piece(driver)] + toolkit_pieces(toolkit, environ)


def toolkit_pieces(toolkit, environ=None):
    """The pieces of ``toolkit`` (:class:`Toolkit`): nvcc and the headers."""
    environ = os.environ if environ is None else environ
    other = _other_toolkit(toolkit, environ)
    nvcc = _nvcc_piece(toolkit, other)
    ignored = [v for v in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT") if environ.get(v)]
    if not nvcc.found and ignored:
        # Often set in the belief that pycuda reads them.
        nvcc = Piece(nvcc.name, False, nvcc.detail, nvcc.remedy + f" ({', '.join(ignored)} "
                     f"{'is' if len(ignored) == 1 else 'are'} set, but pycuda's build does not "
                     "read it: only PATH counts)")
    return [nvcc] + [_header_piece(name, toolkit, other) for name in toolkit.headers]


def driver_piece(driver):
    """The driver's piece, from :func:`probe_driver`'s :class:`Driver`."""
    if driver.usable:
        gpus = ", ".join(g.name for g in driver.gpus)
        return Piece(DRIVER, True, f"{driver.library}, sees {len(driver.gpus)} GPU(s): {gpus}")
    remedy = ("install NVIDIA's driver for the GPU (then `nvidia-smi -L` lists it); in a "
              "container, start it with the GPUs passed in (docker run --gpus all)")
    if "CUDA_ERROR_STUB_LIBRARY" in (driver.error or ""):
        remedy = ("the toolkit's link stub was loaded instead of the driver: take its "
                  "stubs/ directory off LD_LIBRARY_PATH, or " + remedy)
    return Piece(DRIVER, False, driver.error or "not usable", remedy)


_INSTALL_TOOLKIT = ("install NVIDIA's CUDA toolkit, whole (its installer, or the cuda-toolkit "
                    "package of NVIDIA's repositories)")


def _nvcc_piece(toolkit, other):
    if toolkit.nvcc and not toolkit.nvcc_error:
        return Piece(NVCC, True, f"{toolkit.nvcc} ({toolkit.nvcc_version})")
    use_other = f"use the toolkit in {other[0]}: {_export(other[0])}" if other else ""
    if toolkit.nvcc:
        return Piece(NVCC, False, toolkit.nvcc_error,
                     "repair or replace that nvcc, or " + (use_other or _INSTALL_TOOLKIT))
    return Piece(NVCC, False, "not on PATH (pycuda takes the toolkit to be the directory "
                 "above the bin/ holding nvcc, and PyCudaHandler compiles its kernels with it)",
                 use_other or _INSTALL_TOOLKIT + ", and put its bin/ on PATH")


def _header_piece(name, toolkit, other):
    path = toolkit.headers[name]
    if path:
        return Piece(name, True, path)
    if toolkit.include_dirs:
        why = ("set by CUDA_INC_DIR in pycuda's config file" if toolkit.config.get("CUDA_INC_DIR")
               else "the include/ beside nvcc's bin/, where pycuda looks")
        detail = f"not in {', '.join(toolkit.include_dirs)} ({why})"
    else:
        detail = "no toolkit to look in (no nvcc on PATH)"
    if toolkit.compiler_dirs:
        detail += f", nor in the compiler's own {', '.join(toolkit.compiler_dirs)}"
    if other and name in other[1]:
        return Piece(name, False, detail, f"{other[0]} has it, in a whole toolkit: "
                     f"{_export(other[0])}")
    package = {CUDA_H: "cuda-driver-dev", CURAND_H: "libcurand-dev"}[name]
    target = other[0] if other else toolkit.root
    remedy = (f"install {package}{_release_suffix(toolkit.nvcc_version)} (NVIDIA's "
              "repositories) or the whole toolkit")
    return Piece(name, False, detail, remedy + (f", into {target}" if target else ""))


def _export(root):
    return f"export PATH={os.path.join(root, 'bin')}:$PATH"


def _release_suffix(version):
    # NVIDIA's package names end in the toolkit release: libcurand-dev-13-0.
    found = re.search(r"release (\d+)\.(\d+)", version or "")
    return f"-{found.group(1)}-{found.group(2)}" if found else ""


def _other_toolkit(toolkit, environ):
    """``(root, headers)`` of a toolkit elsewhere on this machine that has
    more of the headers than the one pycuda would use (behind a wrapper nvcc
    in /usr/local/bin, say), or None.  Not where a config file chose the
    toolkit: PATH would not change pycuda's mind."""
    if toolkit.config.get("CUDA_ROOT") or toolkit.config.get("CUDA_INC_DIR"):
        return None
    working = toolkit.nvcc and not toolkit.nvcc_error
    # Without a working nvcc, any toolkit with one is better.
    have = sum(1 for p in toolkit.headers.values() if p) if working else -1
    if have == len(toolkit.headers):
        return None
    best = None
    for root, headers in candidate_roots(environ, toolkit):
        wanted = len([h for h in headers if h in toolkit.headers])
        if wanted > have and (best is None or wanted > best[2]):
            best = (root, headers, wanted)
    return best[:2] if best else None


def skip_mode(environ):
    """What :data:`SKIP_ENV` asks: ``"all"``, ``"driver"`` or ``""`` (check
    everything)."""
    value = environ.get(SKIP_ENV, "").strip().lower()
    if value in ("", "0", "no", "false"):
        return ""
    return "driver" if value == "driver" else "all"


def missing_message(found, doctor_hint=True):
    """The one message naming every missing piece of ``found`` (a list of
    :class:`Piece`) and how to get it, ending with how to install anyway (and,
    if ``doctor_hint``, how to see more); None when nothing is missing."""
    missing = [p for p in found if not p.found]
    if not missing:
        return None
    verb = "is" if len(missing) == 1 else "are"
    lines = _wrap(f"streamhandlers[gpu] cannot be installed here: pycuda, which it needs, "
                  f"compiles against the CUDA toolkit, and {len(missing)} of the {len(found)} "
                  f"pieces it needs {verb} missing ({', '.join(p.name for p in missing)}):")
    for p in missing:
        lines += [""] + _wrap(f"{p.name}: MISSING: {p.detail}", "  ", "      ")
        lines += _wrap(f"to get it: {p.remedy}", "      ", "        ")
    present = [p for p in found if p.found]
    if present:
        lines.append("")
        for p in present:
            state = "found" if p.checked else "not checked"
            lines += _wrap(f"{p.name}: {state}: {p.detail}", "  ", "      ")
    lines.append("")
    lines += _wrap(f"To install anyway: {SKIP_ENV}=driver skips only the driver check (to "
                   f"build where no GPU is, such as a container image); {SKIP_ENV}=1 skips every "
                   "check." + ("  Once the package is installed, `python -m handlers.doctor` "
                               "reports what works here." if doctor_hint else ""))
    return "\n".join(lines)


def _wrap(text, first="", rest=""):
    # Paths and commands are kept whole: lines break at spaces only, and not
    # inside "export PATH=...".
    glued = text.replace("export PATH=", "export\0PATH=")
    lines = textwrap.wrap(glued, 88, initial_indent=first, subsequent_indent=rest,
                          break_long_words=False, break_on_hyphens=False)
    return [line.replace("\0", " ") for line in lines]


def preflight(environ=None, probe=probe_driver, config_files=None):
    """The message that stops an install of the ``gpu`` extra, or None when
    every piece is there (or :data:`SKIP_ENV` says to skip).  ``probe`` is
    the driver probe (:func:`probe_driver`)."""
    environ = os.environ if environ is None else environ
    mode = skip_mode(environ)
    if mode == "all":
        return None
    toolkit = find_toolkit(environ, config_files)
    driver = (Piece(DRIVER, True, f"{SKIP_ENV}=driver", checked=False) if mode == "driver"
              else driver_piece(probe()))
    return missing_message([driver] + toolkit_pieces(toolkit, environ))


def _run(argv):
    # stdout of a command, or None where it is missing, fails or hangs.
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None
