"""Documented defaults and edge values that nothing else pinned: Conv2D's
initial weight scale, ``accuracy`` of zero rows, and the reason a reduction
over a repeated axis is refused.  References are float64 NumPy, or the
documented rule itself, on fresh random data."""
import math

import numpy as np
import pytest

from handlers import dtypes
from helpers import rand_input
from layers import Conv2D, Sequential, SquaredError
from layers.metrics import accuracy, device_accuracy


# ============================================================================ Conv2D init
def test_conv2d_initial_weights_are_glorot_uniform_over_the_kernel_fans(handler, rng):
    """Conv2D's W starts U(-a, a) with a = sqrt(6 / (c_in*R*S + c_out*R*S))
    (the documented Glorot rule, fans counted over the whole kernel), b at 0.

    With 3600 draws the largest |W| lies within 3% of a (a miss has
    probability 0.97^3600) and the standard deviation within 6% of a/sqrt(3)
    (4 standard errors); a fan that drops a kernel side, counts one channel
    count twice or uses R*R for R*S moves a by 13% or more."""
    c_in, c_out, kernel = 12, 20, (3, 5)
    net = Sequential(handler, [Conv2D(c_in, c_out, kernel)], SquaredError(),
                     seed=int(rng.integers(2**31)))
    layer = net.layers[0]
    w = handler.get_numpy_copy(layer.params["W"]).astype(np.float64)
    b = handler.get_numpy_copy(layer.params["b"])
    assert w.shape == (c_out, c_in) + kernel
    area = kernel[0] * kernel[1]
    a = math.sqrt(6.0 / (c_in * area + c_out * area))
    top = np.abs(w).max()
    assert top <= a * (1 + 1e-6), f"max |W| {top} beyond the bound {a}"
    assert top >= 0.97 * a, f"max |W| {top} well inside the bound {a}"
    std = w.std()
    assert abs(std / (a / math.sqrt(3.0)) - 1) < 0.06, f"std {std}, want {a / math.sqrt(3.0)}"
    assert abs(w.mean()) < 4 * std / math.sqrt(w.size)
    assert (b == 0).all()


# ============================================================================ accuracy
@pytest.mark.parametrize("targets", [(0,), (0, 1), (0, 4)], ids=["indices", "column", "one-hot"])
def test_accuracy_of_zero_rows_is_nan(handler, targets):
    """``accuracy`` of zero rows is NaN (no fraction of nothing), not 0 or 1,
    whatever the targets' form; ``device_accuracy`` documents the same."""
    assert math.isnan(accuracy(np.zeros((0, 4)), np.zeros(targets)))
    got = device_accuracy(handler, handler.zeros((0, 4)), handler.zeros(targets))
    acc = handler.twin(dtypes.compute_dtype(handler.dtype))   # where the fraction lives
    assert np.isnan(acc.get_numpy_copy(got)).all()


# ============================================================================ sum_t axes
@pytest.mark.parametrize("op", ["sum_t", "mean_t"])
@pytest.mark.parametrize("axis, out_shape", [((0, 0), (4, 5)), ((2, -1), (3, 4)),
                                              ((1, 1), (3, 1, 5))])
def test_reduction_over_a_repeated_axis_is_refused_for_that(handler, rng, op, axis, out_shape):
    """A tuple axis naming one axis twice is refused *because* it repeats:
    ``out`` has the shape the reduction over that axis once would give (so a
    check that dropped the duplicate would accept the call), and the message
    says the axis is named twice.  ``out`` is left as it was."""
    a = rand_input(handler, (3, 4, 5), rng)[0]
    out, out64 = rand_input(handler, out_shape, rng)
    with pytest.raises(ValueError, match=rf"{op}: axis \({axis[0]}, {axis[1]}\) names an "
                                         rf"axis twice"):
        getattr(handler, op)(a, axis, out)
    np.testing.assert_array_equal(handler.get_numpy_copy(out).astype(np.float64), out64)
