"""Documented defaults and edge values that nothing else pinned: ``accuracy``
of zero rows, and the reason a reduction over a repeated axis is refused
(Conv2D's initial weights are pinned in tests/test_layers_conv.py, AdamW's
default weight decay in tests/test_adam.py)."""
import math

import numpy as np
import pytest

from handlers import dtypes
from helpers import rand_input
from layers.metrics import accuracy, device_accuracy


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
