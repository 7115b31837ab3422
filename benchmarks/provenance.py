"""Where a benchmark result came from: the code, the software and the device.

:func:`collect` returns what a saved run records: the git commit and whether
the measured code differed from it, a fingerprint of the measured code, the
date, host, Python and library versions, the GPU's name, driver and CUDA
versions, and its clocks (:func:`clocks`, read again when the run is saved).
Everything here degrades to ``None`` rather than failing: a run on a machine
without git or ``nvidia-smi`` still saves, and says what it could not tell.
"""
import datetime
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the code a benchmark measures: a change here makes a result stale
CODE_PATHS = ("handlers", "layers", "benchmarks")
CODE_SUFFIXES = (".py", ".c", ".h", ".cu", ".cuh")
#: files there that only present results (the report and its run loading):
#: changing them changes no measurement, so it leaves results current
PRESENTATION = ("benchmarks/report.py", "benchmarks/runs.py")
#: pathspec for git of the same code, results and presentation excluded
GIT_CODE_SPEC = [*CODE_PATHS, ":(exclude)benchmarks/results",
                 *(f":(exclude){p}" for p in PRESENTATION)]
LIBRARIES = {"numpy": ("numpy",), "pycuda": ("pycuda",), "scikit-cuda": ("scikit-cuda",),
             "nvmath-python": ("nvmath-python",), "torch": ("torch",),
             "cupy": ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x")}
SMI_FIELDS = ("clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "temperature.gpu", "power.draw", "pstate")


def _run(cmd, cwd=ROOT):
    """stdout of ``cmd`` stripped, or None if it cannot run or fails."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_files(root=ROOT):
    """The measured code's files, sorted, as paths relative to ``root``."""
    root = Path(root)
    found = []
    for top in CODE_PATHS:
        for path in (root / top).rglob("*"):
            rel = path.relative_to(root)
            if (path.suffix in CODE_SUFFIXES and path.is_file() and "__pycache__" not in rel.parts
                    and rel.parts[:2] != ("benchmarks", "results")
                    and rel.as_posix() not in PRESENTATION):
                found.append(rel)
    return sorted(found)


def code_fingerprint(root=ROOT):
    """SHA-256 (first 16 hex digits) over the measured code's paths and bytes.

    Needs no git, so the report can tell on any checkout, a CI clone or a
    copy on the GPU machine alike, whether a result measured this code."""
    h = hashlib.sha256()
    for rel in code_files(root):
        h.update(rel.as_posix().encode() + b"\0")
        h.update((Path(root) / rel).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_state(root=ROOT):
    """``(commit, dirty)``: HEAD and whether the measured code differs from it.

    A copy of the tree on another machine (the GPU machine gets one without
    our ``.git``) names its commit in the environment: ``STREAMHANDLERS_GIT_COMMIT``
    and ``STREAMHANDLERS_CODE_AT_COMMIT``, the code fingerprint of that commit,
    both printed by ``python -m benchmarks.provenance`` on a clean checkout.
    Then ``dirty`` is whether the copy's code fingerprint differs from the
    commit's, and None (unknown) where the fingerprint was not given."""
    commit = os.environ.get("STREAMHANDLERS_GIT_COMMIT")
    if commit:
        at_commit = os.environ.get("STREAMHANDLERS_CODE_AT_COMMIT")
        return commit, (None if not at_commit else at_commit != code_fingerprint(root))
    commit = _run(["git", "rev-parse", "HEAD"], root)
    if commit is None:
        return None, None
    return commit, _is_dirty(root)


def _is_dirty(root=ROOT):
    """Whether the measured code (tracked or not) differs from HEAD; None if unknown."""
    status = _run(["git", "status", "--porcelain", "--", *GIT_CODE_SPEC], root)
    return None if status is None else bool(status)


def commits_since(commit, root=ROOT):
    """How many commits since ``commit`` touched the measured code (results
    excluded), or None where git cannot tell (no git, shallow clone)."""
    if not commit:
        return None
    out = _run(["git", "rev-list", "--count", f"{commit}..HEAD", "--", *GIT_CODE_SPEC], root)
    return int(out) if out and out.isdigit() else None


def versions():
    """Installed versions of the libraries a result depends on (None: absent)."""
    out = {}
    for name, dists in LIBRARIES.items():
        out[name] = None
        for dist in dists:
            try:
                out[name] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def _smi(fields):
    out = _run(["nvidia-smi", "--id=0", f"--query-gpu={','.join(fields)}",
                "--format=csv,noheader,nounits"])
    if not out:
        return None
    values = [v.strip() for v in out.splitlines()[0].split(",")]
    return dict(zip(fields, values)) if len(values) == len(fields) else None


def clocks():
    """GPU 0's clocks (MHz), temperature, power and performance state now,
    from ``nvidia-smi``, or None without one."""
    return _smi(SMI_FIELDS)


def gpu():
    """GPU 0's name, driver and CUDA versions, or None without a GPU."""
    info = _smi(("name", "driver_version", "memory.total"))
    try:
        import pycuda.driver as drv
        drv.init()
        dev = drv.Device(0)
        info = dict(info or {})
        info.setdefault("name", dev.name())
        info["cuda_driver_api"] = drv.get_driver_version()
        info["cuda_pycuda_built_with"] = ".".join(map(str, drv.get_version()))
        info["compute_capability"] = ".".join(map(str, dev.compute_capability()))
    except Exception:   # no pycuda, no driver or no device: nvidia-smi's word stands
        pass
    torch = sys.modules.get("torch")
    if info is not None and torch is not None:
        info["cuda_torch_built_with"] = torch.version.cuda
    return info


def cpu_name():
    """The CPU model from /proc/cpuinfo where there is one, else platform's guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect(root=ROOT):
    """Everything a saved run records about where it came from."""
    commit, dirty = git_state(root)
    return {
        "commit": commit,
        "dirty": dirty,
        "code_fingerprint": code_fingerprint(root),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        "gpu": gpu(),
        "clocks_before": clocks(),
    }


def summary(info):
    """One line: commit, dirty, device, clocks, the versions that matter."""
    commit = (info.get("commit") or "unknown")[:10]
    dirty = {True: " (dirty)", False: "", None: " (dirty: unknown)"}[info.get("dirty")]
    g = info.get("gpu") or {}
    c = info.get("clocks_before") or {}
    v = info.get("versions") or {}
    libs = ", ".join(f"{k} {x}" for k, x in v.items() if x)
    dev = (f"{g.get('name')}, driver {g.get('driver_version')}, SM {c.get('clocks.sm')} MHz, "
           f"memory {c.get('clocks.mem')} MHz" if g else "no GPU")
    return (f"provenance: commit {commit}{dirty}, code {info.get('code_fingerprint')}; "
            f"{dev}; {libs}")


def export_lines(root=ROOT):
    """Shell lines naming HEAD and its code fingerprint, for a copy of this
    checkout on another machine; refuses (SystemExit) if the code is dirty."""
    commit = _run(["git", "rev-parse", "HEAD"], root)
    if commit is None or _is_dirty(root) is not False:
        raise SystemExit("provenance: commit the measured code first (or no git here)")
    return [f"export STREAMHANDLERS_GIT_COMMIT={commit}",
            f"export STREAMHANDLERS_CODE_AT_COMMIT={code_fingerprint(root)}"]


if __name__ == "__main__":
    print("\n".join(export_lines()))
