"""Handler fixtures for the whole suite.

* ``handler``: one test per handler configuration in ``HANDLER_CONFIGS``; a
  configuration that cannot be built here (no pycuda, no BLAS package, no GPU)
  skips with the reason.  Each configuration is constructed once per session.
* ``--handler=SUBSTR`` (repeatable, or comma separated) keeps only the
  configurations whose id contains one of the substrings.
* ``rng``: a NumPy generator seeded per test from a per-session base seed
  (``--seed=N`` to reproduce); a failing test's report shows both seeds.
* ``make_handler(handler_id, seed=None, dtype=None)`` builds a fresh handler of
  a configuration (for seeded-randomness tests); ``handler_id`` is the id of the
  current test's handler.
"""
import os
import secrets
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

try:
    import handlers  # noqa: F401
except ImportError:  # run as plain `pytest` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handlers import NumpyHandler  # noqa: E402

#: id -> (backend, constructor keyword arguments)
HANDLER_CONFIGS = {
    "numpy-f32": ("numpy", {"dtype": np.float32}),
    "numpy-f64": ("numpy", {"dtype": np.float64}),
    "pycuda-skcuda-f32": ("pycuda", {"dtype": np.float32, "blas": "scikit-cuda"}),
    "pycuda-nvmath-f32": ("pycuda", {"dtype": np.float32, "blas": "nvmath"}),
    "pycuda-f64": ("pycuda", {"dtype": np.float64}),
    "numpy-f16": ("numpy", {"dtype": np.float16}),
    "numpy-bf16": ("numpy", {"dtype": "bfloat16"}),
    "pycuda-f16": ("pycuda", {"dtype": np.float16}),
    "pycuda-bf16": ("pycuda", {"dtype": "bfloat16"}),
}
#: The half-format configurations run only in test modules that set
#: ``HALF_FORMATS = True`` (their tolerances come from helpers.tolerance).
HALF_IDS = ("numpy-f16", "numpy-bf16", "pycuda-f16", "pycuda-bf16")

#: handler id -> session handler, or the skip reason (str) when unavailable
_SESSION_HANDLERS = {}
#: (handler id, dtype) -> handler of the other dtype, for wrong-dtype arrays
_SIBLINGS = {}
_BASE_SEED = None


def pytest_addoption(parser):
    group = parser.getgroup("streamhandlers")
    group.addoption("--handler", action="append", default=[], metavar="SUBSTR",
                    help="run only handler configurations whose id contains SUBSTR "
                         "(repeatable or comma separated; ids: "
                         + ", ".join(HANDLER_CONFIGS) + ")")
    group.addoption("--seed", type=int, default=None,
                    help="base seed of the per-test random generators "
                         "(default: $STREAMHANDLERS_SEED or random)")


def pytest_configure(config):
    global _BASE_SEED
    seed = config.getoption("--seed")
    if seed is None and os.environ.get("STREAMHANDLERS_SEED"):
        seed = int(os.environ["STREAMHANDLERS_SEED"])
    _BASE_SEED = secrets.randbits(32) if seed is None else seed


def selected_handler_ids(config):
    wanted = [s.strip() for opt in config.getoption("--handler") for s in opt.split(",")]
    wanted = [s for s in wanted if s]
    if not wanted:
        return list(HANDLER_CONFIGS)
    return [hid for hid in HANDLER_CONFIGS if any(s in hid for s in wanted)]


def pytest_generate_tests(metafunc):
    if "handler" in metafunc.fixturenames:
        ids = selected_handler_ids(metafunc.config)
        if not getattr(metafunc.module, "HALF_FORMATS", False):
            ids = [i for i in ids if i not in HALF_IDS]
        metafunc.parametrize("handler", ids, ids=ids, indirect=True)


def _construct(handler_id, seed=None, dtype=None):
    """Build a handler of configuration ``handler_id``; skip if impossible here."""
    backend, kwargs = HANDLER_CONFIGS[handler_id]
    kwargs = dict(kwargs, seed=seed)
    if dtype is not None:
        kwargs["dtype"] = dtype
    if backend == "numpy":
        return NumpyHandler(**kwargs)
    try:
        from handlers import PyCudaHandler
        return PyCudaHandler(**kwargs)
    except ImportError as e:
        missing = getattr(e, "name", None)
        if missing and not missing.startswith("handlers"):
            what = f"{missing} is not installed"
        elif "pycuda" in str(e) and "not installed" in str(e):
            what = "pycuda is not installed"
        else:
            what = "PyCudaHandler cannot be imported"
        pytest.skip(f"{handler_id}: {what} ({type(e).__name__}: {e})")
    except RuntimeError as e:
        pytest.skip(f"{handler_id}: no usable GPU (RuntimeError: {e})")


def session_handler(handler_id):
    """The session's handler for ``handler_id`` (constructed on first use)."""
    cached = _SESSION_HANDLERS.get(handler_id)
    if cached is None:
        try:
            cached = _construct(handler_id, seed=_BASE_SEED)
        except pytest.skip.Exception as e:
            cached = str(e.msg)
        _SESSION_HANDLERS[handler_id] = cached
    if isinstance(cached, str):
        pytest.skip(cached)
    return cached


def make_handler(handler_id, seed=None, dtype=None):
    """A fresh handler of configuration ``handler_id`` (optionally another dtype).

    Fresh handlers have their own random state: use one for seeded-randomness
    tests instead of the shared session handler.
    """
    session_handler(handler_id)  # skip early, with the cached reason
    return _construct(handler_id, seed=seed, dtype=dtype)


def sibling_handler(handler_id, dtype):
    """A cached handler of the same configuration with ``dtype``."""
    key = (handler_id, np.dtype(dtype))
    if key not in _SIBLINGS:
        _SIBLINGS[key] = make_handler(handler_id, seed=0, dtype=dtype)
    return _SIBLINGS[key]


@pytest.fixture
def handler(request):
    return session_handler(request.param)


@pytest.fixture
def handler_id(request, handler):
    return request.node.callspec.params["handler"]


@pytest.fixture(name="make_handler")
def make_handler_fixture():
    return make_handler


@pytest.fixture(name="sibling_handler")
def sibling_handler_fixture():
    return sibling_handler


@pytest.fixture
def rng(request):
    seed = (_BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**32
    request.node.user_properties.append(("rng_seed", seed))
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seeds = [v for k, v in item.user_properties if k == "rng_seed"]
        if seeds:
            report.sections.append(
                ("random seeds", f"test seed {seeds[0]}; rerun with --seed={_BASE_SEED}"))


def pytest_report_header(config):
    return f"streamhandlers: base seed {_BASE_SEED} (rerun with --seed={_BASE_SEED})"


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    if _SESSION_HANDLERS:
        tr.section("streamhandlers handlers")
        for hid, h in _SESSION_HANDLERS.items():
            tr.write_line(f"SKIPPED {h}" if isinstance(h, str) else f"{hid}: {h!r}")
    counts = {}
    for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        n = sum("test_validation.py::test_bad_input" in getattr(rep, "nodeid", "")
                for rep in tr.stats.get(outcome, []))
        if n:
            counts[outcome] = n
    if counts:
        tr.write_line("bad-input validation cases: "
                      + ", ".join(f"{v} {k}" for k, v in counts.items()))
    for outcome in ("passed", "failed"):   # resource figures of the stability test
        for rep in tr.stats.get(outcome, []):
            for key, value in getattr(rep, "user_properties", ()):
                if key == "stability" and rep.when == "call":
                    tr.write_line(f"stability {rep.nodeid.split('[')[-1].rstrip(']')}: {value}")
    tr.write_line(f"base seed {_BASE_SEED} (rerun with --seed={_BASE_SEED})")
