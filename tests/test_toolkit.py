"""The gpu extra's install preflight (handlers/toolkit.py, tools/gpu_preflight)
and ``python -m handlers.doctor``.

The toolkit checks run against fake toolkits made in tmp_path: an ``nvcc``
shell script that prints a release line, and ``include/`` directories with or
without ``cuda.h`` and ``curand.h``.  The compiler's system directories and
the usual install places are emptied for these tests, so that a real toolkit
on the machine cannot answer for a fake one.  The driver is faked too, except
where a test says what it expects of this machine's.
"""
import ast
import base64
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from handlers import toolkit
from handlers.doctor import run_probes

ROOT = Path(__file__).resolve().parents[1]
BACKEND = ROOT / "tools" / "gpu_preflight" / "backend.py"
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fake nvcc is a shell script")

NO_DRIVER = toolkit.Driver(None, None, (), "could not load libcuda.so.1 (faked)")
A_DRIVER = toolkit.Driver("libcuda.so.1", (13, 0),
                          (toolkit.Gpu(0, "Fake GPU", 80 << 30, (9, 0)),), None)


@pytest.fixture(autouse=True)
def no_system_toolkit(monkeypatch):
    """Only the fake trees count: no system include directory, no usual
    install place."""
    monkeypatch.setattr(toolkit, "SYSTEM_INCLUDE_DIRS", ())
    monkeypatch.setattr(toolkit, "USUAL_ROOTS", ())


def fake_toolkit(root, headers=("cuda.h", "curand.h"), release="12.4", exit_code=0):
    """A toolkit at ``root``: bin/nvcc (a script printing nvcc's banner) and
    include/ with ``headers``.  Returns ``root``."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n"
                    f"exit {exit_code}\n")
    nvcc.chmod(0o755)
    for h in headers:
        (root / "include" / h).write_text("/* fake */\n")
    return root


def env_for(tmp_path, *path, **extra):
    """An environment whose PATH is ``path`` and HOME an empty directory."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": os.pathsep.join(str(p) for p in path), "HOME": str(home), **extra}


def flat(text):
    """``text`` with every run of whitespace one space: messages wrap at spaces."""
    return " ".join(text.split())


def missing_names(message):
    """The pieces a preflight message reports missing, from its lines."""
    return [line.split(":")[0].strip() for line in message.splitlines()
            if ": MISSING:" in line]


def test_complete_fake_toolkit_is_found_where_pycuda_looks(tmp_path):
    root = fake_toolkit(tmp_path / "cuda")
    env = env_for(tmp_path, tmp_path / "empty", root / "bin")
    t = toolkit.find_toolkit(env, config_files=[])
    assert t.nvcc == str(root / "bin" / "nvcc")
    assert t.nvcc_version == "release 12.4, V12.4.1"
    assert t.root == str(root)
    assert t.headers == {"cuda.h": str(root / "include" / "cuda.h"),
                         "curand.h": str(root / "include" / "curand.h")}
    assert toolkit.preflight(env, probe=lambda: A_DRIVER, config_files=[]) is None


def test_message_names_every_missing_piece_at_once(tmp_path):
    # CUDA_HOME naming an empty directory: pycuda's build ignores it, and so does the check
    (tmp_path / "empty").mkdir()
    env = env_for(tmp_path, tmp_path / "empty", CUDA_HOME=str(tmp_path / "empty"))
    message = toolkit.preflight(env, probe=lambda: NO_DRIVER, config_files=[])
    assert missing_names(message) == ["NVIDIA driver", "nvcc", "cuda.h", "curand.h"]
    assert "4 of the 4 pieces" in flat(message)
    assert "CUDA_HOME is set, but pycuda's build does not read it" in flat(message)
    # and how to get past it
    assert f"{toolkit.SKIP_ENV}=driver" in message and f"{toolkit.SKIP_ENV}=1" in message


def test_missing_curand_alone(tmp_path):
    root = fake_toolkit(tmp_path / "cuda", headers=("cuda.h",), release="13.0")
    env = env_for(tmp_path, root / "bin")
    message = toolkit.preflight(env, probe=lambda: A_DRIVER, config_files=[])
    assert missing_names(message) == ["curand.h"]
    assert "1 of the 4 pieces it needs is missing" in flat(message)
    assert "libcurand-dev-13-0" in message        # the package for nvcc's release
    assert f"cuda.h: found: {root / 'include' / 'cuda.h'}" in flat(message)


def test_wrapper_nvcc_without_headers_beside_it(tmp_path):
    # /usr/local/bin/nvcc exec'ing the real one: pycuda looks in /usr/local/include.
    real = fake_toolkit(tmp_path / "cuda-13.0")
    wrap_bin = tmp_path / "local" / "bin"
    wrap_bin.mkdir(parents=True)
    (wrap_bin / "nvcc").write_text(f'#!/bin/sh\nexec {real / "bin" / "nvcc"} "$@"\n')
    (wrap_bin / "nvcc").chmod(0o755)
    env = env_for(tmp_path, wrap_bin, CUDA_HOME=str(real))
    t = toolkit.find_toolkit(env, config_files=[])
    assert t.root == str(tmp_path / "local")
    assert t.nvcc_version == "release 12.4, V12.4.1"    # the wrapper runs
    message = toolkit.preflight(env, probe=lambda: A_DRIVER, config_files=[])
    assert missing_names(message) == ["cuda.h", "curand.h"]
    assert str(tmp_path / "local" / "include") in message
    # the remedy points at the whole toolkit that CUDA_HOME names
    assert f"export PATH={real / 'bin'}:$PATH" in flat(message)


def test_linked_nvcc_is_not_followed(tmp_path):
    real = fake_toolkit(tmp_path / "cuda")
    link_bin = tmp_path / "usr" / "bin"
    link_bin.mkdir(parents=True)
    (link_bin / "nvcc").symlink_to(real / "bin" / "nvcc")
    t = toolkit.find_toolkit(env_for(tmp_path, link_bin), config_files=[])
    assert t.root == str(tmp_path / "usr")
    assert t.headers == {"cuda.h": None, "curand.h": None}


def test_headers_on_the_compilers_path_count(tmp_path):
    root = fake_toolkit(tmp_path / "cuda", headers=())
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "curand.h").write_text("")
    env = env_for(tmp_path, root / "bin", CPLUS_INCLUDE_PATH=str(extra))
    t = toolkit.find_toolkit(env, config_files=[])
    assert t.headers == {"cuda.h": None, "curand.h": str(extra / "curand.h")}


def test_nvcc_that_fails(tmp_path):
    root = fake_toolkit(tmp_path / "cuda", exit_code=3)
    message = toolkit.preflight(env_for(tmp_path, root / "bin"), probe=lambda: A_DRIVER,
                                config_files=[])
    assert missing_names(message) == ["nvcc"]
    assert "failed (exit 3)" in flat(message)


def test_pycuda_config_file_is_read_not_run(tmp_path):
    root = fake_toolkit(tmp_path / "cuda", headers=("cuda.h",))
    sentinel = tmp_path / "ran"
    config = tmp_path / "home" / ".aksetup-defaults.py"
    config.parent.mkdir()
    config.write_text(f"open({str(sentinel)!r}, 'w')\nCUDA_ROOT = {str(root)!r}\n"
                      "CUDA_ENABLE_CURAND = False\n")
    env = env_for(tmp_path, tmp_path / "empty")      # no nvcc on PATH
    t = toolkit.find_toolkit(env)                      # HOME's config file
    assert not sentinel.exists()
    assert t.root == str(root) and t.headers == {"cuda.h": str(root / "include" / "cuda.h")}
    message = toolkit.preflight(env, probe=lambda: A_DRIVER)
    assert missing_names(message) == ["nvcc"]          # curand.h is not needed


@pytest.mark.parametrize("value, mode", [("", ""), ("0", ""), ("false", ""),
                                         ("driver", "driver"), ("DRIVER", "driver"),
                                         ("1", "all"), ("yes", "all")])
def test_skip_modes(value, mode):
    assert toolkit.skip_mode({toolkit.SKIP_ENV: value}) == mode


def test_skip_driver_still_checks_the_toolkit(tmp_path):
    def no_probe():
        raise AssertionError("the driver was probed")
    env = env_for(tmp_path, tmp_path / "empty", **{toolkit.SKIP_ENV: "driver"})
    message = toolkit.preflight(env, probe=no_probe, config_files=[])
    assert missing_names(message) == ["nvcc", "cuda.h", "curand.h"]
    assert "NVIDIA driver: not checked" in message
    root = fake_toolkit(tmp_path / "cuda")
    env["PATH"] = str(root / "bin")
    assert toolkit.preflight(env, probe=no_probe, config_files=[]) is None
    env[toolkit.SKIP_ENV] = "1"
    env["PATH"] = str(tmp_path / "empty")
    assert toolkit.preflight(env, probe=no_probe, config_files=[]) is None


def test_driver_probe_reports_a_library_that_is_not_there():
    d = toolkit.probe_driver(["libstreamhandlers-no-such-driver.so.1"])
    assert d.library is None and not d.usable and d.gpus == ()
    assert "libstreamhandlers-no-such-driver.so.1" in d.error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libc.so.6 is Linux's")
def test_driver_probe_reports_a_library_that_is_not_the_driver():
    d = toolkit.probe_driver(["libc.so.6"])
    assert d.library == "libc.so.6" and not d.usable
    assert "not a usable CUDA driver" in d.error


# A stand-in for the driver library: the calls probe_driver makes, with the C
# signatures of cuda.h.  INIT_RC is what cuInit returns (100 is
# CUDA_ERROR_NO_DEVICE).
FAKE_DRIVER = r"""
#include <stddef.h>
#include <string.h>
#include <stdio.h>
int cuDriverGetVersion(int *v) { *v = 12080; return 0; }
int cuInit(unsigned flags) { return INIT_RC; }
int cuDeviceGetCount(int *n) { *n = 2; return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int dev) {
    snprintf(name, len, "Fake GPU %d", dev); return 0; }
int cuDeviceTotalMem_v2(size_t *bytes, int dev) { *bytes = (size_t)(dev + 1) << 30; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int dev) {
    *v = attr == 75 ? 9 : attr == 76 ? dev : -1; return 0; }
int cuGetErrorName(int rc, const char **s) {
    *s = rc == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN"; return 0; }
"""


def fake_driver(directory, init_rc=0):
    """``directory/libcuda.so.1`` built from FAKE_DRIVER (skips the test
    where there is no C compiler)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a fake driver library")
    directory.mkdir(exist_ok=True)
    source, lib = directory / "fake_cuda.c", directory / "libcuda.so.1"
    source.write_text(FAKE_DRIVER)
    subprocess.run([cc, "-shared", "-fPIC", f"-DINIT_RC={init_rc}", "-o", str(lib), str(source)],
                   check=True, capture_output=True)
    return lib


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="builds a Linux .so")
def test_driver_probe_through_ctypes(tmp_path):
    lib = fake_driver(tmp_path / "ok")
    d = toolkit.probe_driver([str(lib)])
    assert d.usable and d.library == str(lib) and d.cuda_version == (12, 8)
    assert d.gpus == (toolkit.Gpu(0, "Fake GPU 0", 1 << 30, (9, 0)),
                      toolkit.Gpu(1, "Fake GPU 1", 2 << 30, (9, 1)))
    none = toolkit.probe_driver([str(fake_driver(tmp_path / "none", init_rc=100))])
    assert not none.usable and none.gpus == () and none.cuda_version == (12, 8)
    assert none.error == "cuInit failed: CUDA_ERROR_NO_DEVICE (100)"


def load_backend():
    spec = importlib.util.spec_from_file_location("gpu_preflight_backend", BACKEND)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_backend_succeeds_and_writes_a_metadata_only_wheel(tmp_path, monkeypatch):
    root = fake_toolkit(tmp_path / "cuda")
    monkeypatch.setenv("PATH", str(root / "bin"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(toolkit.SKIP_ENV, "driver")    # this machine may have no GPU
    backend = load_backend()
    assert backend.get_requires_for_build_wheel() == []
    dist_info = backend.prepare_metadata_for_build_wheel(str(tmp_path / "meta"))
    metadata = (tmp_path / "meta" / dist_info / "METADATA").read_text()
    assert "Name: streamhandlers-gpu-preflight\n" in metadata
    name = backend.build_wheel(str(tmp_path / "dist"))
    assert name == "streamhandlers_gpu_preflight-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(tmp_path / "dist" / name) as zf:
        assert zf.testzip() is None
        members = sorted(zf.namelist())
        assert members == [f"{dist_info}/{n}" for n in ("METADATA", "RECORD", "WHEEL")]
        assert dist_info == "streamhandlers_gpu_preflight-0.1.0.dist-info"
        assert "Tag: py3-none-any" in zf.read(f"{dist_info}/WHEEL").decode()
        # RECORD: every other member with its sha256 (urlsafe base64, no padding)
        # and size, as the wheel format has it
        record = zf.read(f"{dist_info}/RECORD").decode().splitlines()
        for member in members:
            data = zf.read(member)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            expected = (f"{member},," if member.endswith("RECORD")
                        else f"{member},sha256={digest.decode()},{len(data)}")
            assert expected in record


def test_backend_stops_with_the_message(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(toolkit.SKIP_ENV, raising=False)
    backend = load_backend()
    for hook in (backend.prepare_metadata_for_build_wheel, backend.build_wheel):
        with pytest.raises(SystemExit) as stop:
            hook(str(tmp_path / "out"))
        message = str(stop.value.code)
        names = missing_names(message)
        assert "nvcc" in names                      # no nvcc in an empty PATH
        # the backend's own copy of the module probes this machine's driver
        assert ("NVIDIA driver" in names) == (not toolkit.probe_driver().usable)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    monkeypatch.setenv(toolkit.SKIP_ENV, "1")
    assert backend.build_wheel(str(tmp_path / "out")).endswith(".whl")


def test_setup_gives_the_gpu_extra_the_preflight_first():
    out = subprocess.run([sys.executable, "-c", "import setuptools, sys, runpy\n"
                          "setuptools.setup = lambda **kw: print(kw['extras_require']['gpu'])\n"
                          "runpy.run_path('setup.py')"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    first = ast.literal_eval(out)[0]      # the printed list of requirement strings
    assert first == ("streamhandlers-gpu-preflight @ "
                     + (ROOT / "tools" / "gpu_preflight").as_uri())


def test_probes_survive_errors_crashes_and_hangs():
    results = run_probes({"ok": "    info = 'fine'\n",
                          "raises": "    raise ValueError('broken install')\n",
                          "crashes": "    import os\n    os.abort()\n",
                          "hangs": "    import time\n    time.sleep(60)\n"}, timeout=2)
    assert results["ok"] == (True, "fine")
    assert results["raises"] == (False, "ValueError: broken install")
    assert results["crashes"][0] is False and "died" in results["crashes"][1]
    assert results["hangs"] == (False, "no answer within 2 s")


def gpu_works_here():
    """Whether a PyCudaHandler can be constructed here, asked without the doctor."""
    try:
        import numpy as np

        from handlers import PyCudaHandler
        PyCudaHandler(np.float32)
    except (ImportError, RuntimeError):
        return False
    return True


def test_doctor_reports_and_exits(tmp_path):
    root = fake_toolkit(tmp_path / "cuda", headers=("cuda.h",), release="11.8")
    cache = tmp_path / "kernels"
    cache.mkdir()
    (cache / "a.cubin").write_bytes(b"x" * (3 << 19))    # 1.5 MiB
    (cache / "b.cubin.part").write_bytes(b"x")           # a write in progress: not counted
    env = {**os.environ, "PATH": os.pathsep.join([str(root / "bin"), os.environ["PATH"]]),
           "STREAMHANDLERS_KERNEL_CACHE": str(cache)}
    run = [sys.executable, "-m", "handlers.doctor"]
    done = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for heading in ("NVIDIA driver and GPUs", "CUDA toolkit", "CUDA libraries",
                    "Python packages", "What works here"):
        assert f"\n{heading}" in out
    words = flat(out)
    # the toolkit it reports is the one on this PATH
    assert f"nvcc {root / 'bin' / 'nvcc'} (release 11.8, V11.8.1)" in words
    assert f"cuda.h {root / 'include' / 'cuda.h'}" in words
    assert "curand.h MISSING" in words
    assert f"kernel cache {cache}: 1 compiled module, 1.5 MiB" in words
    assert "NumpyHandler yes" in words
    has_ml_dtypes = importlib.util.find_spec("ml_dtypes") is not None
    assert ("bfloat16 yes" in words) == has_ml_dtypes
    # --gpu, in this machine's own environment (the fake nvcc compiles nothing)
    gpu = subprocess.run(run + ["--gpu"], cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    assert gpu.returncode == (0 if gpu_works_here() else 1), gpu.stderr
    assert "What works here" in gpu.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="builds a Linux .so")
def test_doctor_lists_the_gpus_the_driver_reports(tmp_path):
    lib = fake_driver(tmp_path / "driver")
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent)}
    done = subprocess.run([sys.executable, "-m", "handlers.doctor"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    words = flat(done.stdout)
    assert "GPU 0 Fake GPU 0, 1.0 GiB, compute capability 9.0" in words
    assert "GPU 1 Fake GPU 1, 2.0 GiB, compute capability 9.1" in words
    assert "runs CUDA up to 12.8" in words


def test_wheel_library_paths_look_in_the_wheel_then_the_loader(tmp_path, monkeypatch):
    # an nvidia-<package> wheel: the namespace package nvidia, its lib/ beside
    (tmp_path / "nvidia" / "fakelib").mkdir(parents=True)
    (tmp_path / "nvidia" / "fakelib" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    want = str(tmp_path / "nvidia" / "fakelib" / "lib" / "libfake.so.1")
    assert toolkit.wheel_library_paths("fakelib", "libfake.so.1") == [want, "libfake.so.1"]
    assert toolkit.wheel_library_paths("notinstalled", "libx.so.3") == ["libx.so.3"]
