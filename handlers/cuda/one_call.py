"""PyCudaHandler's most frequent ops in one C call: the same-shape ops
(``add_tt``, ``relu``, ``axpby``, ...), the reductions (``sum_t``, ``max_t``,
...: ``handlers.cuda.reductions.remember``), ``dot_mm`` and ``dot_add_mm``.

For such an op the host work is the checks, the launch's argument packing and
the driver's ``cuLaunchKernel`` (or cuBLAS); the first two cost 0.6-1.3 us in
Python for an elementwise op and 1.5-3.6 us for a product, next to the
driver's 3-4 us launch.  ``handlers.cuda._launch.OneCall`` does both in C for the
common case (exact array type and dtype, C strides, shapes that fit, float or
int scalars) and declines anything else, having done nothing; the op then runs
the handler's Python path, which raises the precise error or handles the
unusual array.  Which ops it serves, and with which kernel, comes from the op
table (``handlers.optable``); ``tests/test_one_call_agrees.py`` proves, on
cases generated from the table, that it accepts nothing the Python checks
reject and launches what the Python path would.  ``install`` puts these ops on
PyCudaHandler; ``make`` builds the C object for one stream group.
"""
import os

from ..base import Handler
from ..optable import ELEMENTWISE
from ..optable import OPS as TABLE


def _call(op):
    """The OneCall method that serves an elementwise row, or None: "run"
    takes arrays only, "scalar" one scalar then arrays; "axpby" is its own.
    Other layouts (clip_t, fill_if: scalars among the arrays) stay in Python."""
    if not op.scalars:
        return "run"
    if op.scalars == op.params[:1] and len(op.params) == 3:
        return "scalar"
    return None


# op -> (OneCall method, kernel), derived from the op table.  "run":
# kernel(pointers..., n) over the op's arrays in order; "scalar": kernel(s,
# pointers..., n); "axpby": kernel(alpha, x, beta, y, n): each the argument
# order of the row's kernel (optable.kernel_format).
OPS = {name: (_call(op), op.kernel) for name, op in ELEMENTWISE.items() if _call(op)}
OPS["axpby"] = ("axpby", TABLE["axpby"].kernel)
KERNELS = tuple(kernel for _, kernel in OPS.values())


class Declined:
    """Stands in for ``OneCall`` while a graph is captured and after
    ``close()``: every call declines, so each op runs its Python path."""

    @staticmethod
    def run(*args):
        return False

    scalar = axpby = sum = dot = run


def make(handler, slot, gemm, block, dry=False):
    """The ``OneCall`` object for ``slot``'s stream:
    grids as ``PyCudaHandler._grid`` sizes them (``_launch.grid``), of ``block``
    threads, each scalar as wide as its kernel's ``fmt`` says; products
    as the records in ``handler._dot_launches`` say (``handlers.cuda.products``
    plans them), on the small-product kernel or on ``gemm`` (the handler's
    cuBLAS object on that stream) where its binding says which function to
    call (``gemm.c_symbol``); chunked reductions on ``slot.sum_scratch``
    (the slot's fixed workspace and counters).  ``dry``: launch nothing
    (``python -m benchmarks hostcost`` times the checks alone)."""
    from ._launch import OneCall
    ops = OneCall(slot.handle, handler.array_type, handler.dtype, handler.dtype.itemsize,
                  block, block * handler._vec, handler._max_blocks,
                  [(handler._k[name].handle, handler._k[name].fmt) for name in KERNELS],
                  dry=dry)
    ops.set_dot(handler._dot_launches, gemm.c_symbol, gemm.handle if gemm.c_symbol else 0,
                handler._k["small_gemm"].handle, gemm.kind)
    ops.set_scratch(*slot.sum_scratch)
    return ops


#: Where the one-call methods are written out (``generated_source``).
GENERATED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated_one_call.py")


def generated_source():
    """The text of ``handlers/cuda/generated_one_call.py``: the one-call
    form of every op in ``OPS``, and of ``dot_mm`` and ``dot_add_mm``:
    OneCall first, the contract's Python path (checks, then the backend
    hook) when it declines.  ``python -m handlers.generate`` writes it."""
    out = ['"""PyCudaHandler\'s one-call ops (``handlers.cuda.one_call``): OneCall first,',
           "the contract's method when it declines.",
           "",
           "Written by ``python -m handlers.generate``: do not edit by hand.",
           '"""',
           "from ..base import Handler", ""]
    for index, (name, (call, _)) in enumerate(OPS.items()):
        sig = ", ".join(TABLE[name].params)
        out += ["", f"def {name}(self, {sig}):",
                f"    if not self._one_call.{call}({index}, {sig}):",
                f"        Handler.{name}(self, {sig})", ""]
    for name, beta in (("dot_mm", 0.0), ("dot_add_mm", 1.0)):
        out += ["", f"def {name}(self, a, b, out, transa=False, transb=False):",
                f"    if not self._one_call.dot(a, b, out, transa, transb, {beta}):",
                f"        Handler.{name}(self, a, b, out, transa, transb)", ""]
    return "\n".join(out[:-1]) + "\n"


def install(cls):
    """Class decorator: give ``cls`` the one-call form of every op in ``OPS``,
    and of ``dot_mm`` and ``dot_add_mm`` (``generated_one_call``), each with
    the contract method's docstring."""
    from . import generated_one_call
    for name in [*OPS, "dot_mm", "dot_add_mm"]:
        op = getattr(generated_one_call, name)
        op.__doc__ = getattr(Handler, name).__doc__
        op.__qualname__ = f"{cls.__name__}.{name}"
        setattr(cls, name, op)
    return cls
