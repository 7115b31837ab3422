"""PyCudaHandler's most frequent ops in one C call: the same-shape ops
(``add_tt``, ``relu``, ``axpby``, ...), ``sum_t``, ``dot_mm`` and ``dot_add_mm``.

For such an op the host work is the checks, the launch's argument packing and
the driver's ``cuLaunchKernel`` (or cuBLAS); the first two cost 0.6-1.3 us in
Python for an elementwise op and 1.5-3.6 us for a product, next to the
driver's 3-4 us launch.  ``handlers._launch.OneCall`` does both in C for the
common case (exact array type and dtype, C strides, shapes that fit, float or
int scalars) and declines anything else, having done nothing; the op then runs
the handler's Python path, which raises the precise error or handles the
unusual array.  ``install`` puts these ops on PyCudaHandler; ``make`` builds
the C object for one stream group (or a stand-in that always declines, where
the extension is not built).
"""
import functools

from .base import Handler

# op -> (OneCall method, kernel).  "run": kernel(pointers..., n) over the
# op's arrays in order; "scalar": kernel(s, pointers..., n); "axpby":
# kernel(alpha, x, beta, y, n).  Each matches the Python path's launch.
OPS = {
    "add_tt": ("run", "binary_add"), "subtract_tt": ("run", "binary_sub"),
    "mult_tt": ("run", "binary_mul"), "divide_tt": ("run", "binary_div"),
    "mult_add_tt": ("run", "binary_mul_add"),
    "abs_t": ("run", "unary_abs"), "sign_t": ("run", "unary_sign"),
    "sqrt_t": ("run", "unary_sqrt"), "log_t": ("run", "unary_log"),
    "exp_t": ("run", "unary_exp"), "sigmoid": ("run", "unary_sigmoid"),
    "tanh": ("run", "unary_tanh"), "relu": ("run", "unary_relu"), "elu": ("run", "unary_elu"),
    "sigmoid_deriv": ("run", "deriv_sigmoid"), "tanh_deriv": ("run", "deriv_tanh"),
    "relu_deriv": ("run", "deriv_relu"), "elu_deriv": ("run", "deriv_elu"),
    "add_st": ("scalar", "scalar_add"), "mult_st": ("scalar", "scalar_mul"),
    "mult_add_st": ("scalar", "scalar_mul_add"),
    "axpby": ("axpby", "axpby"),
}
KERNELS = tuple(kernel for _, kernel in OPS.values())


class Declined:
    """Stands in for ``OneCall`` where the extension is not built: every
    call declines, so each op runs its Python path."""

    @staticmethod
    def run(*args):
        return False

    scalar = axpby = sum = dot = run


def make(handler, slot, block, small_out, small_k, dry=False):
    """The ``OneCall`` object for ``slot``'s stream (or ``Declined()``):
    grids as ``PyCudaHandler._grid`` sizes them, of ``block`` threads; products
    with at most ``small_out`` output elements and inner dimension ``small_k``
    on the small-product kernel, others on the slot's cuBLAS handle where its
    binding says which function to call (``gemm.c_symbol``).  ``dry``: launch
    nothing (``python -m benchmarks hostcost`` times the checks alone)."""
    if handler.launcher != "c":
        return Declined()
    from ._launch import OneCall
    ops = OneCall(slot.handle, handler.array_type, handler.dtype, handler.dtype.itemsize,
                  block, block * handler._vec, handler._max_blocks,
                  [handler._k[name].handle for name in KERNELS], dry=dry)
    gemm = slot.gemm
    ops.set_dot(gemm.c_symbol, gemm.handle if gemm.c_symbol else 0,
                handler._k["small_gemm"].handle, small_out, small_k)
    return ops


def _method(name, call, index):
    slow = getattr(Handler, name)   # the checks, then _binary/_unary/... in Python

    # One wrapper per arity: *args would cost a tuple per call.
    if call == "axpby":
        def op(self, alpha, x, beta, y):
            if not self._one_call.axpby(index, alpha, x, beta, y):
                slow(self, alpha, x, beta, y)
    elif call == "scalar":
        def op(self, s, t, out):
            if not self._one_call.scalar(index, s, t, out):
                slow(self, s, t, out)
    elif slow.__code__.co_argcount == 3:
        def op(self, a, out):
            if not self._one_call.run(index, a, out):
                slow(self, a, out)
    elif slow.__code__.co_argcount == 4:
        def op(self, a, b, out):
            if not self._one_call.run(index, a, b, out):
                slow(self, a, b, out)
    else:
        def op(self, x, y, dy, dx):
            if not self._one_call.run(index, x, y, dy, dx):
                slow(self, x, y, dy, dx)
    return functools.wraps(slow)(op)


def _dot_method(name, beta):
    slow = getattr(Handler, name)

    def op(self, a, b, out, transa=False, transb=False):
        if not self._one_call.dot(a, b, out, transa, transb, beta):
            slow(self, a, b, out, transa, transb)
    return functools.wraps(slow)(op)


def install(cls):
    """Class decorator: give ``cls`` the one-call form of every op in ``OPS``,
    and of ``dot_mm`` and ``dot_add_mm``."""
    ops = {name: _method(name, call, index) for index, (name, (call, _)) in enumerate(OPS.items())}
    ops.update(dot_mm=_dot_method("dot_mm", 0.0), dot_add_mm=_dot_method("dot_add_mm", 1.0))
    for name, op in ops.items():
        op.__qualname__ = f"{cls.__name__}.{name}"
        setattr(cls, name, op)
    return cls
