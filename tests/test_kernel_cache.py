"""kernel_loader's disk cache of compiled kernels, on the CPU: a stand-in
for pycuda's compiler and driver (no nvcc, no GPU), the cache in a
temporary folder.  What it must hold: a process whose own cache is empty
reads a binary another process compiled, whole; the key changes with
anything that changes the binary (source, headers, target, nvcc); a file
appears under its final name only whole, so several processes compiling at
once never read a partial binary (the driver refused one with
CUDA_ERROR_INVALID_IMAGE on a GPU machine, 2026-11-28, when fifteen test
processes started together over pycuda's cache)."""
import builtins
import hashlib
import multiprocessing
import sys
import types
import warnings

import pytest

from handlers.cuda import kernel_loader


class FakeCuda:
    """pycuda's compiler and driver as far as kernel_loader uses them; each
    binary is bytes derived from the source, arch and nvcc version."""

    def __init__(self, monkeypatch, arch=(9, 0), nvcc="release 12.9"):
        self.calls, self.arch, self.nvcc = [], arch, nvcc
        self.context, self.devices = True, 1   # a current context; GPUs present
        pycuda = types.ModuleType("pycuda")
        pycuda.compiler = types.SimpleNamespace(compile=self.compile,
                                                get_nvcc_version=lambda _: self.nvcc)
        pycuda.driver = types.SimpleNamespace(
            Error=RuntimeError, CUDA_DEBUGGING=False, init=lambda: None,
            Device=self.device, Context=types.SimpleNamespace(get_device=self.current))
        for name, mod in (("pycuda", pycuda), ("pycuda.compiler", pycuda.compiler),
                          ("pycuda.driver", pycuda.driver)):
            monkeypatch.setitem(sys.modules, name, mod)
        monkeypatch.setattr(kernel_loader, "_cubins", {})
        self.monkeypatch = monkeypatch

    def device(self, index):
        if index >= self.devices:
            raise RuntimeError("no such device")
        return types.SimpleNamespace(compute_capability=lambda: self.arch)

    def current(self):
        if not self.context:
            raise RuntimeError("no current context")
        return self.device(0)

    def compile(self, source, **kw):
        self.calls.append(kw)
        assert kw["cache_dir"] is False and kw["include_dirs"] == [kernel_loader.KERNEL_DIR]
        return binary(source, kw["arch"], self.nvcc)

    def new_process(self):
        """Forget the process's own cache, as a new process starts."""
        self.monkeypatch.setattr(kernel_loader, "_cubins", {})


def binary(source, arch, nvcc, size=1 << 16):
    """Stand-in binary: ``size`` bytes that depend on every input."""
    seed = hashlib.sha256(f"{source}|{arch}|{nvcc}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "kernels"
    monkeypatch.setenv("STREAMHANDLERS_KERNEL_CACHE", str(folder))
    return folder


def test_a_new_process_reads_the_binary_compiled_before(cache, monkeypatch):
    cuda = FakeCuda(monkeypatch)
    first = kernel_loader.compile_source("kernel one")
    assert first == binary("kernel one", "sm_90", cuda.nvcc) and len(cuda.calls) == 1
    assert kernel_loader.compile_source("kernel one") == first and len(cuda.calls) == 1
    cuda.new_process()
    assert kernel_loader.compile_source("kernel one") == first and len(cuda.calls) == 1
    assert [p.suffix for p in cache.iterdir()] == [".cubin"]     # no leftover part
    assert kernel_loader.compile_source("kernel two") != first and len(cuda.calls) == 2


@pytest.mark.parametrize("change", ["arch", "nvcc", "header"])
def test_the_key_follows_what_changes_the_binary(cache, monkeypatch, tmp_path, change):
    kernels = tmp_path / "src"
    kernels.mkdir()
    (kernels / "common.cuh").write_text("#define ONE 1\n")
    (kernels / "reduce.cu").write_text("not a header: not in the key\n")
    monkeypatch.setattr(kernel_loader, "KERNEL_DIR", str(kernels))
    cuda = FakeCuda(monkeypatch)
    before = kernel_loader.compile_source("kernel")
    cuda.new_process()
    (kernels / "reduce.cu").write_text("changed\n")
    assert kernel_loader.compile_source("kernel") == before and len(cuda.calls) == 1
    cuda.new_process()
    if change == "arch":
        cuda.arch = (10, 0)
    elif change == "nvcc":
        cuda.nvcc = "release 13.0"
    else:
        (kernels / "common.cuh").write_text("#define ONE 2\n")
    kernel_loader.compile_source("kernel")
    assert len(cuda.calls) == 2, f"a changed {change} read the old binary"
    assert cuda.calls[1]["arch"] == ("sm_100" if change == "arch" else "sm_90")


def test_without_a_context_the_target_is_device_0s(cache, monkeypatch):
    """A process that compiles before any handler exists (the GPU machine's
    warm-up) compiles for the device a handler takes by default, under the
    keys that the handlers' processes ask for: on 2026-11-28 it compiled for
    nvcc's default target instead, and every test process then compiled
    every kernel file again, fifteen at once."""
    cuda = FakeCuda(monkeypatch)
    cuda.context = False
    warmed = kernel_loader.compile_source("kernel")
    assert cuda.calls[0]["arch"] == "sm_90"
    cuda.new_process()
    cuda.context = True
    assert kernel_loader.compile_source("kernel") == warmed and len(cuda.calls) == 1
    cuda.new_process()
    cuda.context, cuda.devices = False, 0          # no GPU at all: nvcc's default
    kernel_loader.compile_source("kernel")
    assert cuda.calls[-1]["arch"] is None and len(cuda.calls) == 2


def test_a_final_name_is_never_written_in_place(cache, monkeypatch):
    """The only way a binary reaches its final name is a rename of a whole
    file: an open of a ``.cubin`` for writing would let another process
    read it half written."""
    FakeCuda(monkeypatch)
    real_open = builtins.open

    def open_guard(file, mode="r", *args, **kw):
        assert not (str(file).endswith(".cubin") and set(mode) & set("wa+")), (file, mode)
        return real_open(file, mode, *args, **kw)
    monkeypatch.setattr(builtins, "open", open_guard)
    data = kernel_loader.compile_source("kernel three")
    (path,) = cache.iterdir()
    assert path.read_bytes() == data


def test_no_disk_cache_when_the_variable_is_empty(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMHANDLERS_KERNEL_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cuda = FakeCuda(monkeypatch)
    assert kernel_loader.kernel_cache_dir() is None
    kernel_loader.compile_source("kernel")
    cuda.new_process()
    kernel_loader.compile_source("kernel")
    assert len(cuda.calls) == 2 and not any(tmp_path.iterdir())


def test_the_default_folder_is_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("STREAMHANDLERS_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_loader.kernel_cache_dir() == str(tmp_path / "streamhandlers" / "kernels")


def test_a_folder_that_cannot_be_written_costs_a_warning(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    monkeypatch.setenv("STREAMHANDLERS_KERNEL_CACHE", str(blocker / "kernels"))
    cuda = FakeCuda(monkeypatch)
    with pytest.warns(UserWarning, match="compile it again"):
        data = kernel_loader.compile_source("kernel")
    assert data == binary("kernel", "sm_90", cuda.nvcc)


def _compile_in_child(folder, sources, rounds, queue):
    """A child process: compile ``sources`` ``rounds`` times, its own cache
    cleared each round, and report any binary that differs from the
    expected one."""
    mp = pytest.MonkeyPatch()
    mp.setenv("STREAMHANDLERS_KERNEL_CACHE", folder)
    FakeCuda(mp)
    bad = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for r in range(rounds):
            kernel_loader._cubins.clear()
            for s in sources[r % len(sources):] + sources[:r % len(sources)]:
                if kernel_loader.compile_source(s) != binary(s, "sm_90", "release 12.9", 1 << 16):
                    bad.append(s)
    queue.put(bad)


@pytest.mark.skipif(sys.platform == "win32", reason="fork start method")
def test_processes_compiling_at_once_read_whole_binaries(cache):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    sources = [f"kernel {i}" for i in range(6)]
    children = [ctx.Process(target=_compile_in_child, args=(str(cache), sources, 20, queue))
                for _ in range(6)]
    for c in children:
        c.start()
    for c in children:       # a child that raised exits non-zero (its lists are short)
        c.join(timeout=120)
        assert c.exitcode == 0, c.exitcode
    assert [queue.get(timeout=10) for _ in children] == [[]] * len(children)
    assert sorted(p.suffix for p in cache.iterdir()) == [".cubin"] * len(sources)
