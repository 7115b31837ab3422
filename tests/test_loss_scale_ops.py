"""The device-side ops of dynamic loss scaling: ``scale_finite_t``,
``update_loss_scale`` and ``adam_update``'s ``gate``, against float64 NumPy
references written here, in every format (the halves included)."""
import numpy as np
import pytest

from handlers import dtypes
from helpers import (
    as_handler_values,
    assert_close,
    assert_unchanged,
    rand,
    rand_input,
    shape_id,
)
from test_adam import adam_ref

HALF_FORMATS = True
SHAPES = [(1,), (7,), (3, 5), (1031,), (1048583,)]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan], ids=["finite", "inf", "-inf",
                                                                       "nan"])
@pytest.mark.parametrize("device_factor", [False, True], ids=["factor", "factor-dev"])
def test_scale_finite_t(handler, rng, shape, bad, device_factor):
    values = rand(shape, rng, -3.0, 3.0)
    flat = values.reshape(-1)
    if bad is not None:   # one bad element at a random place, the rest finite
        flat[rng.integers(flat.size)] = bad
    a = handler.create_from_numpy(values)
    held = as_handler_values(handler, values)
    factor = 2.0 ** -int(rng.integers(1, 12)) * 3.0   # not a power of two: one rounding
    arg = handler.create_from_numpy(np.array([factor])) if device_factor else factor
    if device_factor:   # held in the format; a number is passed in the compute format
        factor = float(as_handler_values(handler, [factor])[0])
    flag = handler.create_from_numpy(np.array([7.0]))   # poisoned: must be written
    handler.scale_finite_t(a, arg, flag)
    finite = np.isfinite(held)
    # the product in the compute format (float32 for the halves), rounded once
    cdt = dtypes.compute_dtype(handler.dtype)
    want = np.where(finite, (held.astype(cdt) * cdt.type(factor)), 0.0).astype(handler.dtype)
    assert_close(handler, a, want.astype(np.float64), rtol=0, atol=0)
    assert_close(handler, flag, np.array([1.0 if finite.all() else 0.0]), rtol=0, atol=0)


def _scale_ref(state, flag, interval, max_scale):
    scale, _, streak, skipped = state
    if flag == 0.0:
        scale, streak, skipped = scale / 2, 0.0, skipped + 1
    else:
        streak += 1
        if streak >= interval:
            scale, streak = min(2 * scale, max_scale), 0.0
    return np.array([scale, 1.0 / scale, streak, skipped])


def test_update_loss_scale_follows_a_run_of_flags(handler, rng):
    interval, max_scale = 3.0, 2.0 ** 13
    state = handler.create_from_numpy(np.array([2.0 ** 10, 2.0 ** -10, 0.0, 0.0]))
    want = np.array([2.0 ** 10, 2.0 ** -10, 0.0, 0.0])
    flag = handler.zeros((1,))
    # random flags, long good runs included so the scale reaches max_scale
    flags = (rng.random(60) < 0.85).astype(float)
    flags[10:30] = 1.0
    for f in flags:
        handler.fill(flag, f)
        handler.update_loss_scale(flag, state, interval, max_scale)
        want = _scale_ref(want, f, interval, max_scale)
        assert_close(handler, state, as_handler_values(handler, want), rtol=0, atol=0)
    assert want[0] == max_scale or flags[-20:].min() == 0.0


@pytest.mark.parametrize("device_gate", [False, True], ids=["gate", "gate-dev"])
def test_adam_gate(handler, rng, device_gate):
    shape, lr, beta1, beta2, eps, wd = (1031,), 0.01, 0.8, 0.95, 1e-3, 0.1
    g, rg = rand_input(handler, shape, rng)
    m, rm = rand_input(handler, shape, rng)
    v, rv = rand_input(handler, shape, rng, 0.0, 2.0)
    p, rp = rand_input(handler, shape, rng)
    step = handler.create_from_numpy(np.array([3.0]))
    gate = handler.zeros((1,)) if device_gate else 0.0
    handler.adam_update(g, lr, beta1, beta2, eps, wd, step, m, v, p, gate=gate)
    for arr, ref in ((m, rm), (v, rv), (p, rp), (step, np.array([3.0]))):
        assert_unchanged(handler, arr, ref, "a skipped step's state")
    if device_gate:
        handler.fill(gate, 1.0)
    else:
        gate = 1.0
    handler.adam_update(g, lr, beta1, beta2, eps, wd, step, m, v, p, gate=gate)
    lr_ref = float(np.asarray(lr, dtypes.compute_dtype(handler.dtype)))   # scalars: compute format
    ep, em, ev = adam_ref(rp, rg, rm, rv, 4.0, lr_ref, beta1, beta2, eps, wd, False)
    assert_close(handler, p, ep)
    assert_close(handler, m, em)
    assert_close(handler, step, np.array([4.0]), rtol=0, atol=0)
