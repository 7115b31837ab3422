"""Half formats (float16, bfloat16): what holds for them beyond tests/test_ops.py,
which runs every op on them too.

The semantics checked: an op computes in float32 and rounds once on store, a
reduction accumulates in float32, values beyond a format's range become
infinite (and ``is_fully_finite`` says so), indices stored as floats stay
exact or the op refuses, and arrays of another dtype are a TypeError.
"""
import math

import ml_dtypes
import numpy as np
import pytest

from handlers import DebugHandler, NumpyHandler, dtypes
from helpers import assert_close, poisoned, rand, upload

#: the tests that take the ``handler`` fixture run on the half-format
#: configurations too (conftest), not only on the float16/bfloat16 ``h`` below
HALF_FORMATS = True

BF16 = np.dtype(ml_dtypes.bfloat16)
HALF = {"f16": np.dtype(np.float16), "bf16": BF16}


@pytest.fixture(params=list(HALF), ids=list(HALF))
def h(request):
    return NumpyHandler(HALF[request.param], seed=5)


def test_dtype_names_and_errors():
    assert NumpyHandler("bfloat16").dtype == BF16
    assert NumpyHandler(ml_dtypes.bfloat16).dtype == BF16
    assert NumpyHandler("float16").dtype == np.float16
    with pytest.raises(TypeError, match="dtype must be float32, float64, float16 or bfloat16"):
        NumpyHandler(np.int8)
    with pytest.raises(TypeError, match="NumpyHandler: dtype must be"):
        NumpyHandler("float8")


def test_format_facts():
    """handlers.dtypes against the formats' definitions (and NumPy's finfo)."""
    for dt, bits, emin in ((np.float16, 11, -14), (BF16, 8, -126), (np.float32, 24, -126)):
        assert dtypes.significand_bits(dt) == bits
        assert dtypes.unit_roundoff(dt) == 2.0 ** -bits
        assert dtypes.smallest_subnormal(dt) == 2.0 ** (emin - bits + 1)
        tiny = dtypes.smallest_normal(dt)
        assert tiny == 2.0 ** emin and float(np.array(tiny).astype(dt)) == tiny
        if dt != BF16:
            assert tiny == float(np.finfo(dt).smallest_normal)
        big = dtypes.largest(dt)
        assert np.isfinite(np.array(big).astype(dt)) and (2 - 2.0 ** (1 - bits)) * 2.0 ** (
            -emin + 1) == big
        n = dtypes.exact_integers(dt)
        assert np.array([n - 1, n], np.float64).astype(dt).astype(np.float64).tolist() == [n - 1,
                                                                                           n]
        assert float(np.array(n + 1.0).astype(dt)) != n + 1   # the first whole number lost
    assert dtypes.largest(np.float16) == float(np.finfo(np.float16).max)
    assert dtypes.largest(BF16) == float(ml_dtypes.finfo(BF16).max)


def test_round_trip_keeps_the_dtype_and_every_value(h, rng):
    # every finite value of the format near 1, the range limits, infinities, NaN
    data = np.concatenate([rand((100,), rng, -3, 3), [dtypes.largest(h.dtype),
                          -dtypes.largest(h.dtype), dtypes.smallest_subnormal(h.dtype),
                          np.inf, -np.inf, np.nan, 0.0, -0.0]])
    a = h.create_from_numpy(data)
    got = h.get_numpy_copy(a)
    assert got.dtype == h.dtype
    want = data.astype(h.dtype)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    h.set_from_numpy(a, got)      # host arrays of the format itself
    np.testing.assert_array_equal(h.get_numpy_copy(a).view(np.uint16), want.view(np.uint16))


def test_one_rounding(h, rng):
    """sigmoid and mult_add_tt in the format equal the float32 computation of
    the same stored inputs rounded once (never a rounding per step)."""
    x, rx = upload(h, rand((4096,), rng, -6, 6))
    y = poisoned(h, (4096,))
    h.sigmoid(x, y)
    x32 = rx.astype(np.float32)
    want = (np.float32(1) / (np.float32(1) + np.exp(-x32))).astype(h.dtype)
    got = h.get_numpy_copy(y)
    # float32's exp may differ from NumPy's by an ulp of float32: compare as floats
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2 * dtypes.unit_roundoff(h.dtype))
    a, ra = upload(h, rand((4096,), rng))
    b, rb = upload(h, rand((4096,), rng))
    out, ro = upload(h, rand((4096,), rng))
    h.mult_add_tt(a, b, out)      # out += a * b
    exact = (ra.astype(np.float32) * rb.astype(np.float32) + ro.astype(np.float32))
    np.testing.assert_array_equal(h.get_numpy_copy(out).view(np.uint16),
                                  exact.astype(h.dtype).view(np.uint16))


def test_reductions_accumulate_in_float32(h):
    # 1000 ones: bfloat16 accumulation would stop at 256, float16's at 2048
    ones = h.ones((4000,))
    out = poisoned(h, (1,))
    h.sum_t(ones, 0, out)
    assert float(h.get_numpy_copy(out)[0]) == 4000.0
    h.mean_t(ones, 0, out)
    assert float(h.get_numpy_copy(out)[0]) == 1.0
    a = h.create_from_numpy(np.full((3, 3000), 0.1))
    prod = poisoned(h, (3, 3))
    h.dot_mm(a, a, prod, transb=True)   # 3000 products, summed in float32
    v = float(np.float64(np.array(0.1).astype(h.dtype))) ** 2 * 3000
    assert_close(h, prod, np.full((3, 3), v))


def test_overflow_becomes_inf_and_is_reported(h):
    big = dtypes.largest(h.dtype)
    a = h.create_from_numpy(np.array([big, 1.0]))
    out = poisoned(h, (2,))
    h.add_tt(a, a, out)
    assert h.get_numpy_copy(out)[0] == np.inf
    assert h.is_fully_finite(a) and not h.is_fully_finite(out)
    with np.errstate(over="ignore"):
        beyond = h.create_from_numpy(np.array([big * 4.0]))  # rounds to inf on the way in
    assert not h.is_fully_finite(beyond)
    tiny = dtypes.smallest_subnormal(h.dtype)
    t = h.create_from_numpy(np.array([tiny, tiny / 4]))  # the second rounds to 0
    assert h.get_numpy_copy(t).astype(np.float64).tolist() == [tiny, 0.0]


def test_other_dtypes_are_a_type_error(h):
    other = NumpyHandler(np.float32).zeros((3,))
    mine = h.zeros((3,))
    with pytest.raises(TypeError, match=f"add_tt: expected dtype {h.dtype}, got float32"):
        h.add_tt(mine, other, mine)
    half_other = NumpyHandler(np.float16 if h.dtype == BF16 else BF16).zeros((3,))
    with pytest.raises(TypeError, match="add_tt: expected dtype"):
        h.add_tt(half_other, mine, mine)
    assert (h.get_numpy_copy(mine) == 0).all()


def test_indices_stay_exact_or_the_op_refuses(h):
    n = dtypes.exact_integers(h.dtype)
    a = h.zeros((2, n + 1))
    h.set_from_numpy(a, np.arange(2 * (n + 1), dtype=np.float64).reshape(2, n + 1) % (n + 1))
    out = poisoned(h, (2,))
    h.argmax_t(a, 1, out)                           # index n: still exact
    assert h.get_numpy_copy(out).astype(np.float64).tolist() == [n, n]
    with pytest.raises(ValueError, match=f"too many for {h.dtype} indices"):
        h.argmax_t(h.zeros((2, n + 2)), 1, out)
    # max pooling stores indices within the window: any image size is exact,
    # a window of more than n positions is refused
    x = h.zeros((1, 1, 64, 64))
    out, arg = poisoned(h, (1, 1, 4, 4)), poisoned(h, (1, 1, 4, 4))
    h.maxpool2d_forward(x, out, arg, 16)            # 256 positions: exact in both
    assert (h.get_numpy_copy(arg).astype(np.float64) == 0).all()
    side = math.isqrt(n) + 1                        # side * side > n
    with pytest.raises(ValueError, match=f"maxpool2d_forward: a window of {side}x{side} has"):
        h.maxpool2d_forward(h.zeros((1, 1, side, side)), h.zeros((1, 1, 1, 1)),
                            h.zeros((1, 1, 1, 1)), side)


def test_random_ops_round_float32_draws(h):
    """fill_gaussian draws float32 numbers (the same as a float32 handler of
    the same seed would) and rounds each once."""
    out = h.zeros((1000,))
    h.fill_gaussian(0.0, 1.0, out)
    f32 = NumpyHandler(np.float32, seed=5)
    want = f32.zeros((1000,))
    f32.fill_gaussian(0.0, 1.0, want)
    np.testing.assert_array_equal(h.get_numpy_copy(out).view(np.uint16),
                                  f32.get_numpy_copy(want).astype(h.dtype).view(np.uint16))


def test_capture_and_debug_handler(h, rng):
    x, rx = upload(h, rand((6, 5), rng))
    y = poisoned(h, (6, 5))
    with h.capture() as g:
        h.tanh(x, y)
    g.replay()
    assert_close(h, y, np.tanh(rx))
    d = DebugHandler(h, check_finite=True)
    z = poisoned(h, (6, 5))
    d.exp_t(x, z)
    d.synchronize_all_streams()
    assert_close(h, z, np.exp(rx))


def test_layers_train_in_a_half_format(h, rng):
    """A small MLP trains (its loss falls) in the format: the ops compose."""
    from layers import SGD, FullyConnected, ReLU, Sequential, SoftmaxCrossEntropy
    net = Sequential(h, [FullyConnected(4, 16), ReLU(), FullyConnected(16, 3)],
                     SoftmaxCrossEntropy(), seed=1)
    x = rng.standard_normal((64, 4))
    y = (x[:, :1] > 0).astype(np.float64) + (x[:, 1:2] > 0)
    xd, yd = h.create_from_numpy(x), h.create_from_numpy(y)
    opt = SGD(net.parameters, lr=0.1)
    losses = []
    for _ in range(60):
        losses.append(float(h.get_numpy_copy(net.train_step(xd, yd))[0]))
        opt.step()
    assert np.isfinite(losses).all() and losses[-1] < 0.6 * losses[0], losses[::10]


def test_trainer_bookkeeping_in_a_half_format(h, rng):
    """Trainer.fit and evaluate in a half format: the host reads the losses
    as float64, so the epoch means and the history are plain floats."""
    from layers import SGD, FullyConnected, Sequential, SoftmaxCrossEntropy, Trainer
    net = Sequential(h, [FullyConnected(5, 3)], SoftmaxCrossEntropy(), seed=2)
    x = rng.standard_normal((50, 5))
    y = rng.integers(0, 3, 50)
    history = Trainer(net, SGD(net.parameters, lr=0.05), batch_size=16, seed=0,
                      progress=False).fit(x, y, 2, eval_data=(x, y))
    assert len(history.step_losses) == 2 * 4
    assert all(type(v) is float and np.isfinite(v) for v in history.step_losses)
    for e in history.epochs:
        assert type(e["train_loss"]) is float and np.isfinite(e["eval_loss"])
        # the epoch loss is the batch-size weighted mean of its steps (16, 16, 16, 2)
        steps = history.step_losses[4 * (e["epoch"] - 1):4 * e["epoch"]]
        assert e["train_loss"] == pytest.approx(np.average(steps, weights=[16, 16, 16, 2]))


def test_negative_zero_keeps_its_sign(handler, rng):
    """-0.0 is stored with its sign bit, in every format (the half ones
    computing in float32 and rounding back): fill, copy_to, mult_st,
    mult_tt and add_tt produce -0.0 where IEEE arithmetic in float64 does,
    also over an array that held +0.0 (the same value, another bit
    pattern)."""
    n = 37

    def signs(arr):
        got = handler.get_numpy_copy(arr).astype(np.float64)
        assert (got == 0).all()
        return np.signbit(got)

    neg = handler.zeros((n,))
    handler.fill(neg, -0.0)
    assert signs(neg).all()
    dst = handler.zeros((n,))
    handler.copy_to(neg, dst)
    assert signs(dst).all()
    out = handler.zeros((n,))
    handler.mult_st(-1.0, handler.zeros((n,)), out)        # -1 * +0
    assert signs(out).all()
    out = handler.zeros((n,))
    handler.mult_st(2.5, neg, out)                         # 2.5 * -0
    assert signs(out).all()
    x, x64 = upload(handler, rand((n,), rng))              # both signs, no zeros
    out = handler.zeros((n,))
    handler.mult_tt(x, handler.zeros((n,)), out)           # x * +0: the sign of x
    np.testing.assert_array_equal(signs(out), np.signbit(x64 * 0.0))
    handler.mult_tt(x, neg, out)                           # x * -0: the other sign
    np.testing.assert_array_equal(signs(out), np.signbit(x64 * -0.0))
    out = handler.zeros((n,))
    handler.add_tt(neg, neg, out)                          # -0 + -0 = -0
    assert signs(out).all()
    handler.add_tt(neg, handler.zeros((n,)), out)          # -0 + +0 = +0
    assert not signs(out).any()
