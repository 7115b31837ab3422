"""An output in read-only memory is refused before the op writes anything.

NumpyHandler takes any C-contiguous ``numpy.ndarray`` of its dtype, read-only
ones included (``np.frombuffer`` over ``bytes``, or
``create_from_device_array`` of such an array): every op checks that each of
its outputs is writeable with its other rules, so that an op with several
outputs never writes the first and then fails on the second.  The valid
calls come from ``test_validation.OPS``; each output in turn is made
read-only, and every array of the call must be unchanged afterwards.
GPU arrays are never read-only: ``create_from_device_array`` refuses memory
whose ``__cuda_array_interface__`` says it is.
"""
import re

import numpy as np
import pytest

from handlers import NumpyHandler
from handlers.optable import PUBLIC
from helpers import rand
from test_validation import OPS, Arr, Call, method

CASES = [pytest.param(op.name, p.name, id=f"{op.name}:{p.name}")
         for op in OPS if method(op.name) in PUBLIC
         for p in op.params
         if isinstance(p, Arr) and p.name in PUBLIC[method(op.name)].writes]


def test_every_op_with_an_output_has_a_case():
    """Each op of the table that writes an array is covered here."""
    covered = {method(c.values[0]) for c in CASES}
    writers = {name for name, op in PUBLIC.items() if op.writes and op.kind == "op"}
    assert writers - covered == set()


@pytest.mark.parametrize("op_name,output", CASES)
def test_read_only_output_refused_before_any_write(handler, handler_id, sibling_handler,
                                                   make_handler, rng, op_name, output):
    """ValueError naming the op and the output; no array of the call changed
    (the other outputs included)."""
    if handler.array_type is not np.ndarray:
        pytest.skip(f"{type(handler).__name__} arrays are never read-only")
    op = next(o for o in OPS if o.name == op_name)
    call = Call(handler, handler_id, sibling_handler, make_handler, rng, op, {})
    good = call.args[output]
    frozen = np.frombuffer(good.tobytes(), dtype=good.dtype).reshape(good.shape)
    assert not frozen.flags.writeable
    call.args[output] = frozen
    call.watched.append((handler, frozen, frozen.copy()))
    with pytest.raises(ValueError) as info:
        getattr(handler, method(op_name))(*call.args.values())
    msg = str(info.value)
    assert re.search(rf"\b{method(op_name)}\b", msg) and output in msg and "read-only" in msg
    call.check_unchanged()


def test_set_from_numpy_into_read_only_memory(rng):
    """set_from_numpy's destination is an output too."""
    h = NumpyHandler()
    frozen = np.frombuffer(np.zeros(6, np.float32).tobytes(), np.float32)
    with pytest.raises(ValueError, match="set_from_numpy: a .*read-only"):
        h.set_from_numpy(frozen, rand((6,), rng))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")   # numpy.matrix's own
def test_matrix_is_not_an_array(rng):
    """numpy.matrix (always 2-D, * is a matrix product) and masked arrays are
    refused as handler arrays with a TypeError naming the op and the type."""
    h = NumpyHandler(np.float64)
    m = np.asmatrix(rand((3, 4), rng))
    out = h.zeros((4,))
    with pytest.raises(TypeError, match=r"sum_t: expected numpy\.ndarray, got .*matrix"):
        h.sum_t(m, 0, out)
    masked = np.ma.masked_array(rand((3, 4), rng), mask=False)
    with pytest.raises(TypeError, match=r"add_tt: expected numpy\.ndarray, got .*MaskedArray"):
        h.add_tt(masked, masked, h.zeros((3, 4)))
    np.testing.assert_array_equal(out, 0.0)


class _ReadOnlyDeviceArray:
    """A device array's interface marked read-only (over a handler array)."""

    def __init__(self, a):
        cai = dict(a.__cuda_array_interface__)
        cai["data"] = (cai["data"][0], True)
        self.__cuda_array_interface__ = cai
        self.base = a


def test_read_only_device_array_refused(handler):
    """PyCudaHandler: create_from_device_array refuses memory marked read-only."""
    if not hasattr(handler.zeros((1,)), "__cuda_array_interface__"):
        pytest.skip(f"{type(handler).__name__} arrays have no __cuda_array_interface__")
    with pytest.raises(ValueError, match="create_from_device_array: the array is read-only"):
        handler.create_from_device_array(_ReadOnlyDeviceArray(handler.zeros((4,))))
