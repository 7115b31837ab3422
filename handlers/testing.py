"""Test your own layers and ops on every handler: a pytest plugin and helpers.

Installing streamhandlers registers this module as a pytest plugin (the
``pytest11`` entry point ``handlers.testing``), so in any project a test
that asks for ``handler`` runs once per handler configuration this machine
can build, with no conftest::

    from handlers.testing import assert_close, check_layer_gradients

    def test_my_layer(handler, rng):
        check_layer_gradients(handler, MyLayer(8, 4), (5, 8), rng)

Fixtures:

* ``handler``: one test per configuration of :data:`CONFIGS` (NumPy and, with
  pycuda and a GPU, PyCudaHandler; float32 and float64, and the half formats
  in modules that set ``HALF_FORMATS = True``).  A configuration that cannot
  be built here skips with the reason; the session summary lists each one
  built or skipped.  Each is constructed once per session.
* ``handler_id``: the configuration's id (``"numpy-f32"``, ...);
  ``make_handler(handler_id, seed=None, dtype=None)`` builds a fresh one
  (its own random generator, for seeded-randomness tests).
* ``rng``: a NumPy generator seeded per test from the session's base seed; a
  failing test's report shows the seed to replay with ``--seed=N``.

Options: ``--handler=SUBSTR`` (repeatable or comma separated) keeps the
configurations whose id contains one of the substrings; ``--seed=N`` sets
the base seed (default ``$STREAMHANDLERS_SEED`` or random).

Helpers: :func:`rand` and :func:`rand_input` (random data without exact
zeros), :func:`poisoned` (an output filled with NaN, so an element an op
fails to write shows up), :func:`tolerance` and :func:`assert_close` (the
format's tolerances against a float64 reference), :func:`check_layer_gradients`
(a layer's backward against float64 central differences, and every handler
against that) and :func:`check_fused_op` (a ``fused_op`` against a NumPy
expression).
"""
from __future__ import annotations

import math
import os
import secrets
import zlib

import numpy as np
import pytest

from . import dtypes
from .numpy_handler import NumpyHandler

__all__ = ["CONFIGS", "HALF_IDS", "LAYER_TOLERANCE", "as_handler_values", "assert_close",
           "assert_normwise_close", "assert_unchanged", "by_dtype", "central_differences",
           "check_fused_op", "check_layer_gradients", "make_handler", "poisoned", "rand",
           "rand_input", "tolerance", "tolerance_of", "upload"]

#: configuration id -> (backend, constructor keyword arguments)
CONFIGS = {
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
#: The half-format configurations: only in test modules that set
#: ``HALF_FORMATS = True`` (their results need the formats' own tolerances).
HALF_IDS = ("numpy-f16", "numpy-bf16", "pycuda-f16", "pycuda-bf16")


# ------------------------------------------------------------------ the plugin
class _Session:
    """The session's handlers (id -> handler, or the skip reason) and seed."""

    handlers = {}
    siblings = {}     # (id, dtype) -> handler of another dtype
    base_seed = None


def pytest_addoption(parser):
    group = parser.getgroup("streamhandlers")
    group.addoption("--handler", action="append", default=[], metavar="SUBSTR",
                    help="run only handler configurations whose id contains SUBSTR "
                         "(repeatable or comma separated; ids: " + ", ".join(CONFIGS) + ")")
    group.addoption("--seed", type=int, default=None,
                    help="base seed of the per-test random generators "
                         "(default: $STREAMHANDLERS_SEED or random)")


def pytest_configure(config):
    seed = config.getoption("--seed")
    if seed is None and os.environ.get("STREAMHANDLERS_SEED"):
        seed = int(os.environ["STREAMHANDLERS_SEED"])
    _Session.base_seed = secrets.randbits(32) if seed is None else seed
    _Session.handlers, _Session.siblings = {}, {}


def selected_ids(config):
    """The configuration ids ``--handler`` keeps (all without it)."""
    wanted = [s.strip() for opt in config.getoption("--handler") for s in opt.split(",")]
    wanted = [s for s in wanted if s]
    if not wanted:
        return list(CONFIGS)
    return [hid for hid in CONFIGS if any(s in hid for s in wanted)]


def pytest_generate_tests(metafunc):
    if "handler" in metafunc.fixturenames:
        ids = selected_ids(metafunc.config)
        if not getattr(metafunc.module, "HALF_FORMATS", False):
            ids = [i for i in ids if i not in HALF_IDS]
        metafunc.parametrize("handler", ids, ids=ids, indirect=True)


def _construct(handler_id, seed=None, dtype=None):
    """Build a handler of configuration ``handler_id``; skip if impossible here."""
    backend, kwargs = CONFIGS[handler_id]
    kwargs = dict(kwargs, seed=seed)
    if dtype is not None:
        kwargs["dtype"] = dtype
    if backend == "numpy":
        return NumpyHandler(**kwargs)
    try:
        from . import PyCudaHandler
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
        if _gpu_broken(e):
            raise
        pytest.skip(f"{handler_id}: no usable GPU (RuntimeError: {e})")


#: Driver statuses that mean this machine has no GPU to use (no device, no
#: or too old a driver, every device taken): a skip.  Any other driver error
#: while a handler is built (a kernel module the driver refuses, memory)
#: comes from a GPU that is there, and fails the test: as a skip it would
#: hide a broken GPU run as one that had nothing to check.
NO_GPU_STATUSES = frozenset({
    "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA_ERROR_NOT_INITIALIZED",
    "CUDA_ERROR_STUB_LIBRARY", "CUDA_ERROR_DEVICE_UNAVAILABLE",
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    "CUDA_ERROR_NOT_SUPPORTED"})


def _gpu_broken(error):
    """True if ``error``, raised while a PyCudaHandler was built, is a
    driver error of this library's (``CudaError``) other than one of
    ``NO_GPU_STATUSES``.  pycuda's own errors (its ``cuInit`` finding no
    device) and other RuntimeErrors stay skips."""
    from .cuda.kernel_loader import CudaError
    return isinstance(error, CudaError) and error.status not in NO_GPU_STATUSES


def session_handler(handler_id):
    """The session's handler of configuration ``handler_id`` (built on first
    use); skips the calling test if it cannot be built here."""
    cached = _Session.handlers.get(handler_id)
    if cached is None:
        try:
            cached = _construct(handler_id, seed=_Session.base_seed)
        except pytest.skip.Exception as e:
            cached = str(e.msg)
        _Session.handlers[handler_id] = cached
    if isinstance(cached, str):
        pytest.skip(cached)
    return cached


def make_handler(handler_id, seed=None, dtype=None):
    """A fresh handler of configuration ``handler_id`` (optionally of another
    dtype), with its own random state: for seeded-randomness tests."""
    session_handler(handler_id)  # skip early, with the cached reason
    return _construct(handler_id, seed=seed, dtype=dtype)


def sibling_handler(handler_id, dtype):
    """A cached handler of the same configuration with ``dtype``."""
    key = (handler_id, np.dtype(dtype))
    if key not in _Session.siblings:
        _Session.siblings[key] = make_handler(handler_id, seed=0, dtype=dtype)
    return _Session.siblings[key]


@pytest.fixture
def handler(request):
    """The handler of this test's configuration (see the module docstring)."""
    return session_handler(request.param)


@pytest.fixture
def handler_id(request, handler):
    """The id of this test's handler configuration."""
    return request.node.callspec.params["handler"]


@pytest.fixture(name="make_handler")
def make_handler_fixture():
    """:func:`make_handler`, as a fixture."""
    return make_handler


@pytest.fixture(name="sibling_handler")
def sibling_handler_fixture():
    """:func:`sibling_handler`, as a fixture."""
    return sibling_handler


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the session's base seed and the test's id."""
    seed = (_Session.base_seed + zlib.crc32(request.node.nodeid.encode())) % 2**32
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
                ("random seeds",
                 f"test seed {seeds[0]}; rerun with --seed={_Session.base_seed}"))


def pytest_report_header(config):
    return (f"streamhandlers: base seed {_Session.base_seed} "
            f"(rerun with --seed={_Session.base_seed})")


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    if _Session.handlers:
        tr.section("streamhandlers handlers")
        for hid, h in _Session.handlers.items():
            tr.write_line(f"SKIPPED {h}" if isinstance(h, str) else f"{hid}: {h!r}")
        tr.write_line(f"base seed {_Session.base_seed} "
                      f"(rerun with --seed={_Session.base_seed})")


# ------------------------------------------------------------------ data
def rand(shape, rng, low=-1.0, high=1.0):
    """Fresh float64 uniform data in [low, high), with no exact zeros."""
    a = rng.uniform(low, high, shape)
    nonzero = high / 2 if (low + high) / 2 == 0 else (low + high) / 2
    return np.where(a == 0, nonzero, a)


def as_handler_values(handler, data):
    """``data`` rounded to the handler's dtype, returned as float64."""
    return np.asarray(data, dtype=handler.dtype).astype(np.float64)


def upload(handler, data):
    """Return (handler array holding ``data``, float64 reference of its values)."""
    return handler.create_from_numpy(data), as_handler_values(handler, data)


def rand_input(handler, shape, rng, low=-1.0, high=1.0):
    """Random handler array and its float64 reference: see :func:`rand`."""
    return upload(handler, rand(shape, rng, low, high))


def poisoned(handler, shape):
    """A handler array filled with NaN: an element an op fails to write shows up."""
    return handler.create_from_numpy(np.full(shape, np.nan))


# ------------------------------------------------------------------ tolerances
def tolerance(handler, n=1):
    """(rtol, atol) for comparing a handler result with a float64 reference.

    ``n`` is the length of the longest sum behind one result element (1 for
    elementwise ops, k for a product, the reduced length for a sum).  A
    float32 sum of n unit-scale terms has an error that grows like eps * n;
    5e-5 * sqrt(n) keeps a 2x margin over that at n = 2**20 while staying well
    below the size of one dropped or doubled term.  A half format computes in
    float32 and rounds once: float32's tolerance plus one unit roundoff of
    the format, relative, or half a subnormal step.
    """
    dt = np.dtype(handler.dtype)
    if dtypes.is_half(dt):
        rt, at = tolerance_of(np.float32, n)
        return rt + 1.01 * dtypes.unit_roundoff(dt), at + dtypes.smallest_subnormal(dt)
    return tolerance_of(dt, n)


def by_dtype(handler, f32, f64):
    """A tolerance chosen per format: ``f32`` for float32, ``f64`` for
    float64; a half format computes in float32 and rounds once, so ``f32``
    plus one unit roundoff of the format."""
    dt = np.dtype(handler.dtype)
    if dtypes.is_half(dt):
        return f32 + 1.01 * dtypes.unit_roundoff(dt)
    return f32 if dt == np.float32 else f64


def tolerance_of(dtype, n=1):
    """:func:`tolerance` for float32 or float64 results."""
    if np.dtype(dtype) == np.float32:
        return 1e-5, (1e-6 if n <= 1 else 5e-5 * math.sqrt(n))
    return 1e-12, 1e-12 * max(1.0, math.sqrt(n))


def assert_close(handler, actual, expected, n=1, rtol=None, atol=None, err_msg=""):
    """Copy the handler array ``actual`` back and compare it with the float64
    ``expected`` within :func:`tolerance` (``n``: the longest sum behind one
    element) unless ``rtol``/``atol`` are given.  The copy must have the
    handler's dtype and ``expected``'s shape; NaN passes only where
    ``expected`` is NaN too, and infinities must match exactly."""
    got = handler.get_numpy_copy(actual)
    expected = np.asarray(expected, dtype=np.float64)
    assert isinstance(got, np.ndarray), f"get_numpy_copy returned {type(got).__name__}"
    assert got.dtype == handler.dtype, f"result dtype {got.dtype}, handler dtype {handler.dtype}"
    assert got.shape == expected.shape, f"result shape {got.shape}, expected {expected.shape}"
    rt, at = tolerance(handler, n)
    np.testing.assert_allclose(got.astype(np.float64), expected,
                               rtol=rt if rtol is None else rtol,
                               atol=at if atol is None else atol,
                               equal_nan=True, err_msg=err_msg)


def assert_unchanged(handler, arr, ref, what="input"):
    """``arr`` still holds exactly the values ``ref`` (float64 reference)."""
    got = handler.get_numpy_copy(arr).astype(np.float64)
    np.testing.assert_array_equal(got, ref, err_msg=f"{what} was modified")


# ------------------------------------------------------------------ layers
#: Normwise relative error allowed between another handler's forward and
#: backward and the float64 reference, per format: float64 rounds at 1e-16,
#: float32 at 6e-8 (a layer's sums and products, a few hundred terms, stay
#: far below 1e-4), the halves compute in float32 and round each op's result
#: (a few ops in a row: a few units of 2^-8 for bfloat16, 2^-11 for float16).
LAYER_TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def _worst(num, ana):
    """(normwise relative error, index of the worst element) of ``ana`` against ``num``."""
    diff = np.abs(num - ana)
    scale = max(float(np.abs(num).max(initial=0.0)), float(np.abs(ana).max(initial=0.0)),
                1e-300)
    return float(diff.max(initial=0.0)) / scale, _index(np.argmax(diff), diff.shape)


def _index(flat, shape):
    """The element ``flat`` of an array of ``shape`` as a tuple of Python ints."""
    return tuple(int(i) for i in np.unravel_index(int(flat), shape)) if shape else ()


def assert_normwise_close(want, got, tol, what, want_name="expected", got_name="actual"):
    """Raise AssertionError naming ``what``, the error and the worst element
    (its index, both values) unless the host array ``got`` is within ``tol``
    of ``want`` in normwise relative error,
    ``max(abs(got - want)) / max(abs(want).max(), abs(got).max())``.  A
    non-finite element of ``got`` fails; a ``want`` of zeros needs ``got``
    exactly zero."""
    if want.shape != got.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {want.shape}")
    if not np.isfinite(got).all():
        at = _index(np.argmax(~np.isfinite(got)), got.shape)
        raise AssertionError(f"{what}: {got_name} is {got[at]} at {at} (not finite)")
    if not want.any():
        if got.any():
            at = _index(np.argmax(np.abs(got)), got.shape)
            raise AssertionError(f"{what}: {want_name} is 0 everywhere, {got_name} is "
                                 f"{got[at]:.6g} at {at}")
        return
    err, at = _worst(want, got)
    if not err <= tol:
        raise AssertionError(
            f"{what}: relative error {err:.2e} > {tol:g}; worst element {at}: "
            f"{got_name} {got[at]:.6g}, {want_name} {want[at]:.6g}")


def central_differences(f, values, eps=1e-6):
    """Central differences of the scalar f() with respect to each element of
    the host array ``values`` (changed in place, and restored)."""
    grad = np.zeros_like(values)
    flat, g = values.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        plus = f()
        flat[i] = old - eps
        minus = f()
        flat[i] = old
        g[i] = (plus - minus) / (2 * eps)
    return grad


def _bound(h, layer, x_host, params, seed, prepare):
    """Bind ``layer`` to ``h`` with its own initial parameters from ``seed``,
    or ``params`` (a flat host array, or a function of the flat buffer's
    shape giving one), then run ``prepare`` after one forward; returns the
    parameter set and the input array."""
    from layers import ParameterSet  # layers builds on handlers, not the reverse
    layer.bind(h)
    ps = ParameterSet(h, [layer], seed=seed)
    if callable(params):
        params = params(ps.params.shape)
    if params is not None:
        ps.set(np.asarray(params, dtype=np.float64))
    x = h.create_from_numpy(x_host)
    if prepare is not None:
        layer.forward(x, True)
        prepare(layer)
    return ps, x


def _param_slices(ps):
    """(name, slice of the flat buffer, shape) of every parameter of ``ps``."""
    return [(name, slice(off, off + math.prod(shape)), shape)
            for _, name, off, shape in ps.entries]


def _layer_run(h, layer, x_host, dy_host, params, seed, prepare):
    """One forward and backward of ``layer`` on ``h`` (see :func:`_bound`):
    y, dx (or None) and the flat gradients, on the host in float64."""
    ps, x = _bound(h, layer, x_host, params, seed, prepare)
    y = h.get_numpy_copy(layer.forward(x, True)).astype(np.float64)
    dx = layer.backward(h.create_from_numpy(dy_host))
    dx = None if dx is None else h.get_numpy_copy(dx).astype(np.float64)
    return y, dx, h.get_numpy_copy(ps.grads).astype(np.float64)


def check_layer_gradients(handler, layer, input_shape, rng, *, x=None, params=None,
                          x_grad=True, prepare=None, eps=1e-6, rtol=1e-6, tol=None,
                          on_handler=False):
    """Check ``layer``'s backward, then ``handler``'s forward and backward.

    1. On a float64 NumpyHandler: with a random input of ``input_shape`` (or
       the host array ``x``; inputs are kept 0.1 away from 0, clear of the
       kinks of ReLU-like functions) and the layer's own initial parameters
       (or the flat host array ``params``), the loss L = sum(R * y) for a
       fixed random R: every parameter's gradient, and the input's (unless
       ``x_grad`` is False, for an input of ids), must match float64 central
       differences with step ``eps`` within normwise relative error ``rtol``.
    2. On ``handler``, unless it is that float64 NumpyHandler: with the same
       parameters, input and R rounded to its format, y, dL/dx and every
       parameter's gradient must match the float64 results on the rounded
       values within ``tol`` (default :data:`LAYER_TOLERANCE` of its format).

    ``params="random"`` draws every parameter uniformly from +-[0.5, 1.5]
    instead of the layer's initialization (where LayerNorm's gain is 1 and
    its bias 0, say, a missing factor of the gain in backward would go
    unnoticed).  ``prepare(layer)``, if given, runs after one forward and
    before the checked ones (to fix a dropout mask, say).  ``on_handler=True`` runs
    step 1 on ``handler`` itself (a float64 one) and skips step 2: for a
    layer whose random draws differ between handlers (dropout's mask), so
    that no other handler can reproduce its forward.  Each failure is an
    AssertionError naming the layer, the gradient (``dL/dW`` for a
    parameter ``W``, ``dL/dx``) or output, the error and the worst element
    with both values.  The layer is left bound to ``handler``.
    """
    if on_handler and handler.dtype != np.float64:
        raise ValueError(f"check_layer_gradients: on_handler needs a float64 handler, "
                         f"got {handler!r}")
    x_host = np.asarray(x if x is not None else rand(input_shape, rng), dtype=np.float64)
    if x is None:
        x_host = np.sign(x_host) * (0.1 + 0.9 * np.abs(x_host))
    if isinstance(params, str) and params == "random":
        def params(shape):
            return rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    seed = int(rng.integers(2**31))
    exact = handler.dtype == np.float64 and (on_handler or isinstance(handler, NumpyHandler))
    h64 = handler if exact else NumpyHandler(np.float64)
    name = repr(layer)
    # 1. Central differences on float64.
    ps, x64 = _bound(h64, layer, x_host, params, seed, prepare)
    p_host = ps.get().astype(np.float64)
    R = rng.standard_normal(layer.forward(x64, True).shape)
    dx = layer.backward(h64.create_from_numpy(R))
    ana_x = None if dx is None or not x_grad else h64.get_numpy_copy(dx).copy()
    ana_p = h64.get_numpy_copy(ps.grads).copy()

    def loss():
        return float(np.sum(R * h64.get_numpy_copy(layer.forward(x64, True))))

    if ana_x is not None:
        xv = x_host.copy()

        def loss_x():
            h64.set_from_numpy(x64, xv)
            return loss()
        assert_normwise_close(central_differences(loss_x, xv, eps), ana_x, rtol,
                              f"{name} dL/dx", "central difference", "backward")
        h64.set_from_numpy(x64, x_host)
    for pname, at, shape in _param_slices(ps):
        sub = p_host[at].copy()

        def loss_p(at=at, sub=sub):
            full = p_host.copy()
            full[at] = sub
            ps.set(full)
            return loss()
        assert_normwise_close(central_differences(loss_p, sub, eps).reshape(shape),
                              ana_p[at].reshape(shape), rtol, f"{name} dL/d{pname}",
                              "central difference", "backward")
    ps.set(p_host)
    if exact:
        return
    # 2. The handler against float64 on the values it holds.
    xr, pr, Rr = (as_handler_values(handler, a) for a in (x_host, p_host, R))
    y_ref, dx_ref, g_ref = _layer_run(h64, layer, xr, Rr, pr, seed, prepare)
    y_got, dx_got, g_got = _layer_run(handler, layer, xr, Rr, pr, seed, prepare)
    limit = tol if tol is not None else LAYER_TOLERANCE[handler.dtype.name]
    where = f"{name} on {handler!r}"
    assert_normwise_close(y_ref, y_got, limit, f"{where} forward", "float64", "handler")
    if x_grad and dx_ref is not None:
        assert_normwise_close(dx_ref, dx_got, limit, f"{where} dL/dx", "float64", "handler")
    for pname, at, shape in _param_slices(ps):
        assert_normwise_close(g_ref[at].reshape(shape), g_got[at].reshape(shape), limit,
                              f"{where} dL/d{pname}", "float64", "handler")


# ------------------------------------------------------------------ fused ops
def check_fused_op(handler, op, expected, shape, rng, *, scalars=None, low=-1.0, high=1.0,
                   tol=None):
    """Check the fused op ``op`` (``handlers.fused_op``) on ``handler``
    against ``expected``, a NumPy function of its inputs in float64.

    Each array input gets fresh random values in [low, high) of ``shape``
    (a ``:row`` input or output, shape (1, last axis); a ``:col`` input or
    output, one value per row: ``shape`` with last dimension 1); ``scalars``
    maps each scalar
    input's name to its value.  ``expected(**inputs)`` takes the inputs by
    name (float64 arrays of the values the handler holds, scalars as
    floats) and returns the outputs in declared order (an array, or a
    tuple for several).  Outputs start as NaN (:func:`poisoned`), except
    those the body reads before writing (``y = y + x``), which start
    random and are passed to ``expected`` by name too.  Each output must
    match within ``tol`` (normwise relative; default the format's
    :func:`tolerance` for one rounding, or :data:`LAYER_TOLERANCE` for the
    halves), or an AssertionError names the output and its worst element.
    """
    scalars = dict(scalars or {})
    missing = [s for s in op.scalars if s not in scalars]
    if missing:
        raise ValueError(f"check_fused_op: give a value for each scalar input of "
                         f"{op.name}: {missing}")
    values, args = {}, []
    reads_old = op.program.reads_old
    for p in op.params:
        if p in op.scalars:
            values[p] = float(scalars[p])
            args.append(values[p])
            continue
        s = (1, shape[-1]) if p in op.rows or p in op.sums \
            else tuple(shape[:-1]) + (1,) if p in op.cols else shape
        if p in op.outputs and p not in reads_old:
            args.append(poisoned(handler, s))
            continue
        a, ref = rand_input(handler, s, rng, low, high)
        values[p] = ref
        args.append(a)
    op(handler, *args)
    want = expected(**values)
    want = want if isinstance(want, tuple) else (want,)
    if len(want) != len(op.outputs):
        raise ValueError(f"check_fused_op: expected returned {len(want)} arrays for "
                         f"{len(op.outputs)} outputs of {op.name}")
    if tol is None:
        tol = (LAYER_TOLERANCE[handler.dtype.name] if dtypes.is_half(handler.dtype)
               else 4 * tolerance(handler)[0])
    for name, w in zip(op.outputs, want):
        got = handler.get_numpy_copy(args[op.params.index(name)]).astype(np.float64)
        want_w = np.broadcast_to(np.asarray(w, np.float64), got.shape)
        assert_normwise_close(want_w, got, tol, f"{op.name} output {name} on {handler!r}",
                              "NumPy", "handler")
