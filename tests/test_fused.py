"""User-defined fused ops (``handlers.fused_op``), per handler and dtype.

References are float64 NumPy written here, independently of the evaluator in
handlers/fused.py, on fresh random inputs; outputs are poisoned with NaN
first.  The CUDA source generator is tested on the CPU (its text, and with
nvcc where it is installed, that every generated kernel compiles).
"""
import inspect
import math
import re
import shutil
import subprocess

import numpy as np
import pytest

from handlers import CaptureError, DebugHandler, FusedOp, StreamHazardError, dtypes, fused_op
from handlers.cuda import fused_source
from handlers.fused import FUNCTIONS, OPERATIONS
from helpers import as_handler_values, by_dtype, poisoned, rand, shape_id, upload

#: these ops run on the float16 and bfloat16 NumpyHandler too (conftest)
HALF_FORMATS = True

SHAPES = [(1,), (7,), (3, 257), (2, 3, 5), (1100, 1000)]   # the last: more than 2^20
ROW_SHAPES = [(1, 1), (4, 7), (3, 257), (2, 3, 5), (3, 256), (5, 4, 8)]   # the last two: packets

GELU = fused_op("gelu_fwd", inputs="x", outputs="y",
                body="y = 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x ** 3)))")
SUM_DIFF = fused_op("sum_diff", inputs="a b", outputs="p q",
                    body="s = a + b\nd = a - b\np = s * d; q = s / d")
AFFINE = fused_op("affine", inputs="x #alpha $beta", outputs="y", body="y = alpha * x + beta")
BIAS_RELU = fused_op("bias_relu", inputs="x b:row", outputs="y", body="y = max(x + b, 0)")
ACCUMULATE = fused_op("accumulate", inputs="x", outputs="y", body="y += 2 * x")


def close(h, arr, ref, scale=1):
    """Compare the handler array ``arr`` with the float64 ``ref`` (NaN where NaN)."""
    got = h.get_numpy_copy(arr)
    assert got.dtype == h.dtype
    rtol, atol = (1e-12, 1e-13) if h.dtype == np.float64 else (2e-5 * scale, 2e-6 * scale)
    if dtypes.is_half(h.dtype):   # float32 arithmetic, then one rounding to the format
        rtol += 1.01 * dtypes.unit_roundoff(h.dtype)
        atol += dtypes.smallest_subnormal(h.dtype)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol, atol=atol,
                               equal_nan=True)


def quotient(s, d):
    """s / d in float64, as the kernels divide: where a half format's draws
    of a and b are equal, d is 0 and the quotient infinite (or NaN where s is
    0 too), which the comparison then requires of the result as well."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return s / d


def gelu64(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


# ============================================================================ results
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_unary(handler, rng, shape):
    x, x64 = upload(handler, rand(shape, rng, -4, 4))
    y = poisoned(handler, shape)
    GELU(handler, x, y)
    close(handler, y, gelu64(x64))


@pytest.mark.parametrize("shape", SHAPES[:4], ids=shape_id)
def test_several_outputs_and_temporaries(handler, rng, shape):
    (a, a64), (b, b64) = upload(handler, rand(shape, rng)), upload(handler, rand(shape, rng))
    p, q = poisoned(handler, shape), poisoned(handler, shape)
    SUM_DIFF(handler, a, b, p, q)
    s, d = a64 + b64, a64 - b64
    close(handler, p, s * d)
    close(handler, q, quotient(s, d), scale=100)   # a - b may be small: s / d amplifies rounding


def test_scalars_host_and_device(handler, rng):
    x, x64 = upload(handler, rand((5, 9), rng))
    y = poisoned(handler, (5, 9))
    AFFINE(handler, x, 1.5, -0.25, y)
    close(handler, y, 1.5 * x64 - 0.25)
    beta = handler.create_from_numpy(np.array([3.0]))
    AFFINE(handler, x, np.float32(2.0), beta, y)      # a device scalar, read when run
    close(handler, y, 2.0 * x64 + 3.0)


@pytest.mark.parametrize("shape", ROW_SHAPES, ids=shape_id)
@pytest.mark.parametrize("form", ["flat", "kept"])
def test_row_broadcast(handler, rng, shape, form):
    n = shape[-1]
    x, x64 = upload(handler, rand(shape, rng))
    b, b64 = upload(handler, rand((n,) if form == "flat" else (1, n), rng))
    y = poisoned(handler, shape)
    BIAS_RELU(handler, x, b, y)
    close(handler, y, np.maximum(x64 + b64.reshape(n), 0))


def test_accumulating_output_reads_its_old_value(handler, rng):
    assert ACCUMULATE.row.reads == ("x", "y") and ACCUMULATE.row.writes == ("y",)
    (x, x64), (y, y64) = upload(handler, rand((4, 6), rng)), upload(handler, rand((4, 6), rng))
    ACCUMULATE(handler, x, y)
    close(handler, y, y64 + 2 * x64)


def test_comparisons_logic_and_where(handler, rng):
    op = fused_op("logic", "a b", "lt le gt ge eq ne both either neither pick chain", """
lt = a < b; le = a <= b; gt = a > b; ge = a >= b; eq = a == b; ne = a != b
both = a > 0 and b > 0; either = a > 0 or b > 0; neither = not (a > 0 or b > 0)
pick = where(a - b, a, 2 * b)
chain = 1 if -0.5 < a <= b else -1
""")
    av = rand((6, 11), rng)
    bv = np.where(rng.random((6, 11)) < 0.2, av, rand((6, 11), rng))   # some equal pairs
    (a, a64), (b, b64) = upload(handler, av), upload(handler, bv)
    outs = [poisoned(handler, (6, 11)) for _ in op.outputs]
    op(handler, a, b, *outs)
    f = lambda c: c.astype(np.float64)   # noqa: E731
    want = [f(a64 < b64), f(a64 <= b64), f(a64 > b64), f(a64 >= b64), f(a64 == b64),
            f(a64 != b64), f((a64 > 0) & (b64 > 0)), f((a64 > 0) | (b64 > 0)),
            f(~((a64 > 0) | (b64 > 0))), np.where(a64 != b64, a64, 2 * b64),
            np.where((-0.5 < a64) & (a64 <= b64), 1.0, -1.0)]
    for name, out, w in zip(op.outputs, outs, want):
        np.testing.assert_array_equal(handler.get_numpy_copy(out).astype(np.float64), w,
                                      err_msg=name)


# float64 references of every function, and the input range each is tested on
REFERENCES = {
    "exp": (np.exp, (-5, 5)), "expm1": (np.expm1, (-1, 1)), "log": (np.log, (0.1, 5)),
    "log1p": (np.log1p, (-0.5, 2)), "sqrt": (np.sqrt, (0.1, 5)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.1, 5)), "tanh": (np.tanh, (-3, 3)),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-6, 6)), "abs": (np.abs, (-2, 2)),
    "erf": (lambda x: np.vectorize(math.erf)(x), (-2, 2)),
}


@pytest.mark.parametrize("fn", sorted(REFERENCES))
def test_each_function(handler, rng, fn):
    ref, (lo, hi) = REFERENCES[fn]
    op = fused_op(f"f_{fn}", "x", "y", f"y = {fn}(x)")
    x, x64 = upload(handler, rand((3, 33), rng, lo, hi))
    y = poisoned(handler, (3, 33))
    op(handler, x, y)
    close(handler, y, ref(x64), scale=2)


def test_every_function_has_a_test():
    assert set(REFERENCES) | {"max", "min", "where"} == set(FUNCTIONS)


@pytest.mark.parametrize("expr, ref", [
    ("x ** 2", lambda x: x * x), ("x ** 3", lambda x: x ** 3), ("x ** -2", lambda x: x ** -2.0),
    ("x ** 0", lambda x: np.ones_like(x)), ("x ** 7.0", lambda x: x ** 7),
    ("x ** 2.5", lambda x: x ** 2.5), ("2 ** x", lambda x: 2.0 ** x),
    ("-x ** 2", lambda x: -(x * x)), ("min(x, 1.25) / max(x, 0.5)",
                                      lambda x: np.minimum(x, 1.25) / np.maximum(x, 0.5)),
    ("1e300 * 1e300 * 0 + x", lambda x: x * np.nan),    # inf * 0 = NaN, in either dtype
])
def test_powers_and_constants(handler, rng, expr, ref):
    op = fused_op("power", "x", "y", f"y = {expr}")
    x, x64 = upload(handler, rand((4, 5), rng, 0.5, 2))
    y = poisoned(handler, (4, 5))
    op(handler, x, y)
    close(handler, y, ref(x64), scale=4)


def test_nan_and_inf_propagate(handler):
    op = fused_op("edges", "x", "mx mn w gt ne e s p",
                  "mx = max(x, 0); mn = min(0, x); w = where(x, 1, 2); gt = x > 0; "
                  "ne = x != x; e = exp(x); s = sigmoid(x); p = x ** 2")
    xv = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0, 1000.0])
    x, _ = upload(handler, xv)
    outs = [poisoned(handler, xv.shape) for _ in op.outputs]
    op(handler, x, *outs)
    got = {n: handler.get_numpy_copy(o).astype(np.float64) for n, o in zip(op.outputs, outs)}
    nan, inf = np.nan, np.inf
    want = {"mx": [nan, inf, 0, 0, 0, 1000], "mn": [nan, 0, -inf, 0, -1, 0],
            "w": [1, 1, 1, 2, 1, 1], "gt": [0, 1, 0, 0, 0, 1], "ne": [1, 0, 0, 0, 0, 0],
            "e": [nan, inf, 0, 1, math.exp(-1), inf], "s": [nan, 1, 0, 0.5, 1 / (1 + math.e), 1],
            "p": [nan, inf, inf, 0, 1, 1e6]}
    for name, w in want.items():   # as the format holds them (1e6 is inf in float16)
        with np.errstate(over="ignore"):
            w = as_handler_values(handler, w)
        np.testing.assert_allclose(got[name], w, rtol=by_dtype(handler, 1e-6, 1e-6),
                                   equal_nan=True, err_msg=name)


def test_float32_arithmetic_stays_float32(make_handler, handler_id):
    # 1 + 2^-30 rounds to 1 in float32: a float64 intermediate would keep it.
    h = make_handler(handler_id, dtype=np.float32)
    op = fused_op("rounding", "x", "y", "y = (x + 9.313225746154785e-10) - x")
    x = h.create_from_numpy(np.ones(8))
    y = poisoned(h, (8,))
    op(h, x, y)
    assert (h.get_numpy_copy(y) == 0).all()


# ============================================================================ aliasing
def test_output_may_be_an_input(handler, rng):
    (a, a64), (b, b64) = upload(handler, rand((5, 8), rng)), upload(handler, rand((5, 8), rng))
    SUM_DIFF(handler, a, b, a, b)          # both outputs over the inputs: all read first
    s, d = a64 + b64, a64 - b64
    close(handler, a, s * d)
    with np.errstate(divide="ignore", invalid="ignore"):   # a == b in a half format: inf
        ratio = s / d
    close(handler, b, ratio, scale=100)
    x, x64 = upload(handler, rand((40,), rng))
    same = handler.reshape_t(x, (5, 8))    # the same memory through another array object
    y = poisoned(handler, (40,))
    copy = fused_op("copy_twice", "x", "y z", "y = x; z = x")
    copy(handler, x, handler.reshape_t(y, (40,)), handler.reshape_t(same, (40,)))
    close(handler, y, x64)
    close(handler, x, x64)


@pytest.mark.parametrize("offsets", [(0, 0, 0), (1, 0, 0), (0, 0, 3), (2, 2, 2)])
def test_any_alignment(handler, rng, offsets):
    """Arrays at any element offset: 16-byte aligned ones take the GPU's packet
    path (with a tail of n % 4), any misaligned one the element loop."""
    n = 1001
    views = []
    for k in offsets:
        data, _ = upload(handler, rand((n + 3,), rng))
        views.append(handler.view_t(data, k, (n,)))
    a, b, p = views
    a64, b64 = (handler.get_numpy_copy(v).astype(np.float64) for v in (a, b))
    q = poisoned(handler, (n,))
    SUM_DIFF(handler, a, b, p, q)
    s, d = a64 + b64, a64 - b64
    close(handler, p, s * d)
    close(handler, q, quotient(s, d), scale=100)


def test_partial_overlaps_raise_and_write_nothing(handler, rng):
    buf, buf64 = upload(handler, rand((12,), rng))
    x, y = handler.view_t(buf, 0, (8,)), handler.view_t(buf, 2, (8,))
    with pytest.raises(ValueError, match="gelu_fwd: y must be x or not overlap it"):
        GELU(handler, x, y)
    p, q = handler.view_t(buf, 0, (6,)), handler.view_t(buf, 4, (6,))
    a, b = upload(handler, rand((6,), rng))[0], upload(handler, rand((6,), rng))[0]
    with pytest.raises(ValueError, match="sum_diff: p must not overlap q"):
        SUM_DIFF(handler, a, b, p, q)
    with pytest.raises(ValueError, match="sum_diff: p must not overlap q"):
        SUM_DIFF(handler, a, b, p, p)
    ys, beta = upload(handler, rand((6,), rng))[0], None
    beta = handler.view_t(ys, 0, (1,))
    with pytest.raises(ValueError, match="affine: beta must not overlap"):
        AFFINE(handler, a, 1.0, beta, ys)
    np.testing.assert_array_equal(handler.get_numpy_copy(buf).astype(np.float64), buf64)


# ============================================================================ bad calls
def test_bad_calls(handler, handler_id, rng, sibling_handler):
    x, _ = upload(handler, rand((3, 4), rng))
    y = poisoned(handler, (3, 4))
    with pytest.raises(ValueError, match=r"gelu_fwd: shapes differ: x \(3, 4\), y \(4, 3\)"):
        GELU(handler, x, poisoned(handler, (4, 3)))
    with pytest.raises(ValueError, match=r"bias_relu: row input b must have shape \(4,\) or "
                                         r"\(1, 4\)"):
        BIAS_RELU(handler, x, poisoned(handler, (3, 4)), y)
    with pytest.raises(ValueError, match="row input b"):
        BIAS_RELU(handler, x, poisoned(handler, (1, 3)), y)
    with pytest.raises(TypeError, match="gelu_fwd: expected dtype"):
        other = sibling_handler(handler_id, np.float64 if handler.dtype == np.float32
                                else np.float32)
        GELU(handler, x, other.create_from_numpy(np.zeros((3, 4))))
    with pytest.raises(TypeError, match="gelu_fwd"):
        GELU(handler, [1.0, 2.0], y)
    with pytest.raises(TypeError, match="affine: alpha must be a real number"):
        AFFINE(handler, x, "2", 1.0, y)
    with pytest.raises(TypeError):
        GELU(handler, x)                               # missing the output
    with pytest.raises(TypeError, match="gelu_fwd: expected a handler"):
        GELU(x, x, y)
    assert np.isnan(handler.get_numpy_copy(y)).all()   # nothing written


def test_keyword_arguments_and_signature():
    assert str(inspect.signature(AFFINE)) == "(h, x, alpha, beta, y)"
    assert isinstance(AFFINE, FusedOp) and "alpha * x + beta" in AFFINE.__doc__
    assert AFFINE.row.scalars == ("alpha", "beta") and AFFINE.row.device_scalars == ("beta",)


def test_keywords_work(handler, rng):
    x, x64 = upload(handler, rand((2, 3), rng))
    y = poisoned(handler, (2, 3))
    AFFINE(handler, x, beta=1.0, alpha=2.0, y=y)
    close(handler, y, 2 * x64 + 1)


# ============================================================================ declarations
@pytest.mark.parametrize("inputs, outputs, body, message", [
    ("x", "y", "y = x + z", r"unknown name 'z' at line 1, column 9"),
    ("x", "y", "y = foo(x)", r"unknown function 'foo' at line 1, column 5"),
    ("x", "y", "y = x[0]", r"unsupported syntax Subscript"),
    ("x", "y", "y = x.real", r"unsupported syntax Attribute"),
    ("x", "y", "y = x // 2", r"unsupported syntax FloorDiv"),
    ("x", "y", "y = 'a'", r"unsupported constant 'a'"),
    ("x", "y", "y = x\nif x: y = 1", r"unsupported statement If at line 2"),
    ("x", "y", "y = (lambda: x)()", r"unknown function"),
    ("x", "y z", "y = x", r"output 'z' is never assigned"),
    ("x b", "y", "y = x", r"input 'b' is never read"),
    ("x #s", "y", "y = x", r"input 's' is never read"),
    ("x", "y", "x = 1; y = x", r"assignment to input 'x' at line 1, column 1"),
    ("x", "y", "y = max(x, x, x)", r"max takes 1 \(a reduction along the last axis\) or 2 "
                                   r"positional arguments"),
    ("x", "y", "y = exp(x=x)", r"exp takes 1"),
    ("x", "y", "y = x +", r"syntax error in the body at line 1"),
    ("x", "y", "", r"the body assigns nothing"),
    ("x x", "y", "y = x", r"'x' is declared twice"),
    ("x", "x", "x = 1", r"'x' is declared twice"),
    ("exp", "y", "y = 1", r"'exp' cannot name a parameter"),
    ("self", "y", "y = self", r"'self' cannot name a parameter"),
    ("x:foo", "y", "y = x", r"unknown input mode 'foo'"),
    ("x", "", "y = x", r"declares no output"),
    ("x", "y", "tanh = x; y = tanh", r"'tanh' cannot name a value"),
    ("x", "y", "y, z = x, x", r"unsupported statement"),
    ("x", "y", "y = 1 < x is x", r"unsupported comparison Is"),
])
def test_bad_declarations(inputs, outputs, body, message):
    with pytest.raises(ValueError, match="^bad: " + message):
        fused_op("bad", inputs=inputs, outputs=outputs, body=body)


def test_bad_names():
    with pytest.raises(ValueError, match="fused_op: name must be an ASCII identifier"):
        fused_op("not ok", "x", "y", "y = x")
    with pytest.raises(ValueError, match="fused_op: name"):
        fused_op("class", "x", "y", "y = x")
    with pytest.raises(ValueError, match="inputs must be a str"):
        fused_op("op", 3, "y", "y = 1")


def test_digest_follows_the_program_not_the_text():
    a = fused_op("d", "x", "y", "y = x*2  # double")
    b = fused_op("d", "x", "y", "\ny = (x * 2)\n")
    c = fused_op("d", "x", "y", "y = x * 3")
    assert a.digest == b.digest != c.digest


# ============================================================================ streams, graphs
def test_capture_replays_bit_for_bit(make_handler, handler_id, rng):
    eager, captured = make_handler(handler_id), make_handler(handler_id)
    xv, bv = rand((6, 10), rng), rand((10,), rng)

    def step(h, x, b, y, z, beta):
        BIAS_RELU(h, x, b, y)
        AFFINE(h, y, 0.5, beta, z)
        ACCUMULATE(h, z, y)

    def arrays(h):
        return (h.create_from_numpy(xv), h.create_from_numpy(bv), poisoned(h, (6, 10)),
                poisoned(h, (6, 10)), h.create_from_numpy(np.array([1.0])))
    ea, ca = arrays(eager), arrays(captured)
    with captured.capture() as g:
        step(captured, *ca)
    assert np.isnan(captured.get_numpy_copy(ca[2])).all()   # recorded, not run
    for beta in (1.0, -2.0):
        eager.set_from_numpy(ea[4], np.array([beta]))
        captured.set_from_numpy(ca[4], np.array([beta]))   # a device scalar: seen by replay
        step(eager, *ea)
        g.replay()
        for e, c in zip(ea[2:4], ca[2:4]):
            np.testing.assert_array_equal(captured.get_numpy_copy(c), eager.get_numpy_copy(e))
    assert g.ops == 3


def test_on_a_stream_group(handler, rng):
    h1 = handler.with_streams(min(1, handler.num_stream_groups - 1))
    x, x64 = upload(handler, rand((3, 5), rng))
    y = poisoned(handler, (3, 5))
    GELU(h1, x, y)
    handler.wait_for(h1)
    close(handler, y, gelu64(x64))


def test_capture_refuses_an_unforked_group(handler, rng):
    if handler.num_stream_groups < 2:
        pytest.skip("needs 2 stream groups")
    x = upload(handler, rand((3,), rng))[0]
    y = poisoned(handler, (3,))
    with pytest.raises(CaptureError, match="gelu_fwd: stream group 1"):
        with handler.capture():
            GELU(handler.with_streams(1), x, y)


# ============================================================================ bound calls
def test_bound_call_equals_the_call(handler, rng):
    """FusedOp.bind: each call runs the op on the bound arrays again, numbers
    fixed at bind time, device scalars read by each run."""
    (x, x64), (b, b64) = upload(handler, rand((5, 8), rng)), upload(handler, rand((8,), rng))
    y, z = poisoned(handler, (5, 8)), poisoned(handler, (5, 8))
    beta = handler.create_from_numpy(np.array([0.5]))
    relu, affine = BIAS_RELU.bind(handler, x, b, y), AFFINE.bind(handler, y, 2, beta, z)
    assert np.isnan(handler.get_numpy_copy(y)).all()      # binding runs nothing
    for value in (0.5, -3.0):
        handler.set_from_numpy(beta, np.array([value]))
        relu()
        affine()
        y64 = as_handler_values(handler, np.maximum(x64 + b64, 0))   # y as stored
        close(handler, z, 2 * y64 + value)
    handler.set_from_numpy(x, -handler.get_numpy_copy(x))  # new contents, same arrays
    relu()
    y64 = as_handler_values(handler, np.maximum(-x64 + b64, 0))
    close(handler, y, y64)
    acc = ACCUMULATE.bind(handler, x, y)                  # += twice: reads its old value
    acc()
    acc()
    close(handler, y, as_handler_values(handler, y64 - 2 * x64) - 2 * x64)


def test_bind_checks_at_once(handler, rng):
    x = upload(handler, rand((4, 6), rng))[0]
    y = poisoned(handler, (4, 6))
    with pytest.raises(ValueError, match=r"bias_relu: row input b must have shape \(6,\)"):
        BIAS_RELU.bind(handler, x, handler.zeros((5,)), y)
    with pytest.raises(ValueError, match="sum_diff: p must not overlap q"):
        SUM_DIFF.bind(handler, x, x, y, y)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        AFFINE.bind(handler, x, "2", 0.0, y)
    with pytest.raises(TypeError, match="gelu_fwd.bind: expected a handler"):
        GELU.bind(x, y)
    assert np.isnan(handler.get_numpy_copy(y)).all()


def test_bound_calls_are_captured(make_handler, handler_id, rng):
    h = make_handler(handler_id)
    xv = rand((6, 10), rng)
    x, y = h.create_from_numpy(xv), poisoned(h, (6, 10))
    gelu = GELU.bind(h, x, y)
    with h.capture() as g:
        gelu()
    assert np.isnan(h.get_numpy_copy(y)).all()            # recorded, not run
    g.replay()
    x64 = h.get_numpy_copy(x).astype(np.float64)         # x as the handler holds it
    close(h, y, gelu64(x64))
    h.fill(y, 0.0)
    gelu()                                                # eager again after the capture
    close(h, y, gelu64(x64))
    assert g.ops == 1


def test_bound_call_on_a_stream_group(handler, rng):
    h1 = handler.with_streams(min(1, handler.num_stream_groups - 1))
    x, x64 = upload(handler, rand((3, 5), rng))
    y = poisoned(handler, (3, 5))
    GELU.bind(h1, x, y)()
    handler.wait_for(h1)
    close(handler, y, gelu64(x64))


# ============================================================================ DebugHandler
def test_debug_handler_tracks_reads_and_writes(handler, rng):
    if handler.num_stream_groups < 3:
        pytest.skip("needs 3 stream groups")
    debug = DebugHandler(handler)
    d1, d2 = debug.with_streams(1), debug.with_streams(2)
    x, x64 = upload(handler, rand((3, 5), rng))
    y = poisoned(handler, (3, 5))
    GELU(d1, x, y)
    with pytest.raises(StreamHazardError, match="gelu_fwd on stream group 2: read-after-write"):
        GELU(d2, y, x)
    d2.wait_for(d1)
    beta = handler.create_from_numpy(np.array([0.5]))
    AFFINE(d1, x, 1.0, beta, y)          # a device scalar is a read too
    with pytest.raises(StreamHazardError, match="write-after-read .* by affine"):
        debug.with_streams(2).fill(beta, 1.0)
    debug.synchronize_all_streams()
    close(handler, y, x64 + 0.5)
    bound = GELU.bind(d1, x, y)          # a bound call is checked and tracked at each call
    bound()
    with pytest.raises(StreamHazardError, match="gelu_fwd on stream group 2: read-after-write"):
        GELU(d2, y, x)
    with pytest.raises(ValueError, match="gelu_fwd: y must be x or not overlap it"):
        GELU.bind(debug, handler.view_t(x, 0, (2,)), handler.view_t(x, 1, (2,)))
    debug.synchronize_all_streams()


def test_debug_handler_aliasing_and_finite(handler, rng):
    debug = DebugHandler(handler, check_finite=True)
    buf = upload(handler, rand((12,), rng))[0]
    with pytest.raises(ValueError, match="partially overlaps"):
        GELU(debug, handler.view_t(buf, 0, (8,)), handler.view_t(buf, 2, (8,)))
    x = upload(handler, rand((4,), rng, 0.5, 1))[0]
    y = upload(handler, rand((4,), rng))[0]
    before = handler.get_numpy_copy(y)
    log_neg = fused_op("log_neg", "x", "y", "y = log(-x)")
    with pytest.raises(FloatingPointError, match="log_neg on stream group 0 produced NaN"):
        log_neg(debug, x, y)
    np.testing.assert_array_equal(handler.get_numpy_copy(y), before)   # put back
    GELU(debug, x, y)
    assert "y" in GELU.row.describe() and "reads x" in GELU.row.describe()


# ============================================================================ CUDA source
def signature_codes(source):
    """Launch codes of the generated kernel's parameters, read from its text."""
    params = re.search(r"__launch_bounds__\(\d+\) \w+\(\s*(.*?)\)\s*\{", source, re.S).group(1)
    codes = {"const T*": "P", "T*": "P", "T": None, "long long": "q"}
    out = ""
    for p in params.split(","):
        kind = p.strip().rsplit(" ", 1)[0]
        out += codes[kind] or "T"
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_generated_source(dtype):
    src = fused_source.kernel_source(AFFINE, dtype, 256)
    ctype, code = ("float", "f") if dtype == np.float32 else ("double", "d")
    name = fused_source.kernel_name(AFFINE, dtype)
    assert name == f"fused_affine_{AFFINE.digest}_{'f32' if code == 'f' else 'f64'}"
    assert f'extern "C" __global__ void __launch_bounds__(256) {name}(' in src
    assert f"using T = {ctype};" in src and '#include "fused.cuh"' in src
    assert "const T s_beta = sp_beta ? *sp_beta : sv_beta;" in src
    assert "const T t0_y = (fx::mul(s_alpha, v_x) + s_beta);" in src   # no FMA
    assert "out_y[e] = r.y;" in src and "long long n, long long cols" in src
    fmt = fused_source.kernel_format(AFFINE, dtype)
    assert fmt == f"PP{code}P{code}Pqq"
    assert signature_codes(src).replace("T", code) == fmt
    gelu = fused_source.kernel_source(GELU, dtype, 256)
    lit = "0.5f" if dtype == np.float32 else "0.5"
    assert f"fx::mul({lit}, v_x)" in gelu and "dm::tanh(" in gelu and "fx::ipow<3>(v_x)" in gelu
    assert "in_b[c.d0]" in fused_source.kernel_source(BIAS_RELU, dtype, 256)
    assert "load_packet(in_b, c.d0)" in fused_source.kernel_source(BIAS_RELU, dtype, 256)
    acc = fused_source.kernel_source(ACCUMULATE, dtype, 256)
    assert "const auto f = [&](const T v_x, const T o_y) -> Values {" in acc
    assert "return f(in_x[e], out_y[e]);" in acc


def test_literals_round_as_numpy():
    assert fused_source.literal(0.1, np.float32) == "0.10000000149011612f"
    assert float(fused_source.literal(0.1, np.float32)[:-1]) == float(np.float32(0.1))
    assert fused_source.literal(0.1, np.float64) == "0.1"
    assert fused_source.literal(float("inf"), np.float32) == "dm::infinity<T>()"
    # beyond float32's range is infinite there, as np.float32(1e300) is
    assert fused_source.literal(1e300, np.float32) == "dm::infinity<T>()"
    assert fused_source.literal(-1e300, np.float32) == "(-dm::infinity<T>())"
    assert fused_source.literal(1e300, np.float64) == "1e+300"
    assert fused_source.literal(float("nan"), np.float64) == "dm::quiet_nan<T>()"


def test_every_operation_has_a_cuda_form():
    assert set(fused_source.CUDA) == OPERATIONS


EVERYTHING = fused_op(
    "everything", "x b:row #s $d", "y z",
    "u = exp(x) + expm1(x) + log(abs(x)) + log1p(abs(x)) + sqrt(abs(x)) + rsqrt(abs(x))\n"
    "u += tanh(x) + sigmoid(x) + erf(x) + max(x, b) + min(x, s) + where(x, b, d)\n"
    "y = u ** 2 + u ** -3 + u ** 0.5 - -u / d\n"
    "z = (x < b) + (x <= b) + (x > b) + (x >= b) + (x == b) + (x != b) + "
    "(x and b) + (x or b) + (not x) + (1e999 if x else -1e999) + z")
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", [GELU, SUM_DIFF, AFFINE, BIAS_RELU, ACCUMULATE, EVERYTHING],
                         ids=lambda op: op.name)
def test_generated_source_compiles(op, dtype, tmp_path):
    """As tests/test_kernels_compile.py for the .cu files: nvcc accepts the
    generated kernel, and a float kernel does no double arithmetic."""
    src = tmp_path / "fused.cu"
    src.write_text(fused_source.kernel_source(op, dtype, 256))
    kernels = fused_source.__file__.rsplit("/", 1)[0] + "/kernels"
    ptx = tmp_path / "fused.ptx"
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-I", kernels, "-ptx", "-o", str(ptx), str(src)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"nvcc failed:\n{result.stderr}\n{src.read_text()}"
    text = ptx.read_text()
    assert fused_source.kernel_name(op, dtype) in text
    if dtype == np.float32:
        assert ".f64" not in text, "the float kernel computes in double somewhere"


def test_compile_source_is_cached_per_source(monkeypatch):
    """Generated sources go through kernel_loader's one compile path (pycuda's
    compiler, kernels/ on the include path), once per process and source."""
    import sys
    import types

    from handlers.cuda import kernel_loader
    calls = []

    def fake_compile(source, **kw):
        calls.append((source, kw))
        return b"cubin"
    compiler = types.SimpleNamespace(compile=fake_compile, get_nvcc_version=lambda nvcc: "12.9")
    monkeypatch.setitem(sys.modules, "pycuda", types.ModuleType("pycuda"))
    monkeypatch.setitem(sys.modules, "pycuda.compiler", compiler)
    monkeypatch.setenv("STREAMHANDLERS_KERNEL_CACHE", "")   # no disk cache here
    monkeypatch.setattr(kernel_loader, "_cubins", {})
    src = fused_source.kernel_source(GELU, np.float32, 256)
    assert kernel_loader.compile_source(src) == b"cubin"
    assert kernel_loader.compile_source(src) == b"cubin"
    assert len(calls) == 1
    assert calls[0][1]["include_dirs"] == [kernel_loader.KERNEL_DIR]
    assert calls[0][1]["no_extern_c"] is True
    assert calls[0][1]["cache_dir"] is False     # pycuda's cache writes in place


# ============================================================================ pinned semantics
def with_nans(values, rng, fraction=0.3):
    """``values`` with NaN at random places (at least one, and not everywhere)."""
    mask = rng.random(values.shape) < fraction
    mask.flat[0], mask.flat[-1] = True, False
    return np.where(mask, np.nan, values)


def test_min_and_max_propagate_nan_from_the_first_operand(handler, rng):
    """``min(x, 0)`` and ``max(x, 0)`` are NaN where x is NaN (NaN first, not
    only as the second operand, which test_nan_and_inf_propagate covers)."""
    op = fused_op("nan_first", "x", "mn mx", "mn = min(x, 0); mx = max(x, 0)")
    x, x64 = upload(handler, with_nans(rand((5, 13), rng), rng))
    # not poisoned with NaN: a NaN result must be written, not left over
    mn, mx = (handler.create_from_numpy(np.full((5, 13), 7.0)) for _ in range(2))
    op(handler, x, mn, mx)
    nan = np.isnan(x64)
    close(handler, mn, np.where(nan, np.nan, np.minimum(np.nan_to_num(x64), 0.0)))
    close(handler, mx, np.where(nan, np.nan, np.maximum(np.nan_to_num(x64), 0.0)))


def test_augmented_assignment_keeps_operand_order(handler, rng):
    """``y -= x`` is ``y = y - x`` and ``z /= x`` is ``z = z / x`` (the old
    output on the left), not the operands swapped."""
    op = fused_op("decrement", "x", "y z", "y -= x; z /= x")
    x, x64 = upload(handler, rand((4, 7), rng, 0.5, 2))
    (y, y64), (z, z64) = upload(handler, rand((4, 7), rng)), upload(handler, rand((4, 7), rng))
    op(handler, x, y, z)
    close(handler, y, y64 - x64)
    close(handler, z, z64 / x64)


def test_comparisons_are_false_on_nan_but_not_equal(handler, rng):
    """Every comparison with a NaN operand (either side, or both) gives 0,
    except ``!=``, which gives 1; without NaN they are the usual 0 or 1."""
    op = fused_op("nan_compare", "a b", "lt le gt ge eq ne",
                  "lt = a < b; le = a <= b; gt = a > b; ge = a >= b; eq = a == b; ne = a != b")
    shape = (4, 9)
    av, bv = rand(shape, rng), rand(shape, rng)
    bv[3] = av[3]                             # equal pairs: <=, >= and == true
    av[0, :], bv[1, :] = np.nan, np.nan       # NaN on the left, on the right
    av[2, ::2] = bv[2, ::2] = np.nan          # and on both sides
    (a, a64), (b, b64) = upload(handler, av), upload(handler, bv)
    outs = [poisoned(handler, shape) for _ in op.outputs]
    op(handler, a, b, *outs)
    with np.errstate(invalid="ignore"):
        want = {"lt": a64 < b64, "le": a64 <= b64, "gt": a64 > b64, "ge": a64 >= b64,
                "eq": a64 == b64, "ne": a64 != b64}
    for name, out in zip(op.outputs, outs):
        np.testing.assert_array_equal(handler.get_numpy_copy(out).astype(np.float64),
                                      want[name].astype(np.float64), err_msg=name)


def test_logic_on_values_other_than_zero_and_one(handler, rng):
    """``and``, ``or`` and ``not`` take any value not 0 (NaN included) as true
    and give 1.0 or 0.0, never an operand (Python's ``2 and 3`` is 3) nor a
    product or a sum of the operands."""
    op = fused_op("truthiness", "a b", "both either neither", "both = a and b; "
                  "either = a or b; neither = not a")
    shape = (6, 8)
    pick = [0.0, -0.0, 0.5, -3.0, 2.0, 7.25, np.nan]
    av = np.where(rng.random(shape) < 0.5, rng.choice(pick, shape), 4 * rand(shape, rng))
    bv = np.where(rng.random(shape) < 0.5, rng.choice(pick, shape), 4 * rand(shape, rng))
    av[0, :3], bv[0, :3] = [2.0, 0.0, -0.0], [3.0, 0.5, np.nan]
    (a, a64), (b, b64) = upload(handler, av), upload(handler, bv)
    outs = [poisoned(handler, shape) for _ in op.outputs]
    op(handler, a, b, *outs)
    true_a, true_b = a64 != 0, b64 != 0      # NaN != 0 is true
    want = {"both": true_a & true_b, "either": true_a | true_b, "neither": ~true_a}
    for name, out in zip(op.outputs, outs):
        np.testing.assert_array_equal(handler.get_numpy_copy(out).astype(np.float64),
                                      want[name].astype(np.float64), err_msg=name)


def test_output_over_an_input_that_later_outputs_read(handler, rng):
    """An output that is an input's memory is written only after every output
    is computed: later outputs (one a plain copy of the input) see the input's
    old values."""
    op = fused_op("over_input", "x", "p q r", "p = 2 * x; q = x; r = x + 1")
    x, x64 = upload(handler, rand((5, 6), rng))
    q, r = poisoned(handler, (5, 6)), poisoned(handler, (5, 6))
    op(handler, x, handler.reshape_t(x, (5, 6)), q, r)   # p: x's memory, another object
    close(handler, x, 2 * x64)
    close(handler, q, x64)
    close(handler, r, x64 + 1)


def test_device_scalar_over_any_output_raises(handler, rng):
    """A device scalar must not overlap any output: the first (checked by the
    scalar check) and a later one (checked by the shape rule); nothing is
    written."""
    op = fused_op("two_out_scalar", "x $s", "y z", "y = x * s; z = x + s")
    x = upload(handler, rand((6,), rng))[0]
    (y, y64), (z, z64) = upload(handler, rand((6,), rng)), upload(handler, rand((6,), rng))
    with pytest.raises(ValueError, match="two_out_scalar: s must not overlap the output z"):
        op(handler, x, handler.view_t(z, 3, (1,)), y, z)
    with pytest.raises(ValueError, match="two_out_scalar: s must not overlap the output"):
        op(handler, x, handler.view_t(y, 0, (1,)), y, z)
    close(handler, y, y64)
    close(handler, z, z64)


@pytest.mark.parametrize("outputs, body, missing", [
    ("y z", "z = x", "y"),              # the first output never assigned
    ("y z", "y = x + z", "z"),          # read (its old value) but never assigned
    ("y z", "y = z; y = y * x", "z"),   # ditto, through a reassigned output
])
def test_output_never_assigned_raises_at_declaration(outputs, body, missing):
    """An output the body never assigns is refused when the op is declared,
    even when the body reads that output's old contents."""
    with pytest.raises(ValueError, match=f"^unassigned: output '{missing}' is never assigned"):
        fused_op("unassigned", inputs="x", outputs=outputs, body=body)
