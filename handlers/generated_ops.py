"""The contract's array ops, one function per row of ``handlers.optable``
with a shape rule; ``Handler`` takes them as its methods (``base.install_ops``).

Written by ``python -m handlers.generate`` from the table: do not edit by
hand, change the table and run that (``tests/test_optable.py`` fails while
this file is out of date)."""
from . import fused_rows
from .checks import (
    check_any_format,
    check_array_scalar,
    check_arrays,
    check_flag,
    check_same_shape,
    check_scalar,
    check_writable,
    fail_value,
)
from .optable import PUBLIC


def copy_to(self, src, dest):
    """Copy ``src`` into ``dest`` (same shape).  They must not partially overlap."""
    check_same_shape(self, "copy_to", src, dest)
    if self.read_only_arrays and not (dest.flags.writeable):
        check_writable("copy_to", ('dest',), dest)
    self._copy_to(src, dest)


_cast_t_row = PUBLIC['cast_t']


def cast_t(self, src, dst):
    """dst = src converted to this handler's format, rounded once.

    ``src`` has ``dst``'s shape and may be of any format the handler's
    class holds (``supported_dtypes``): an array of a twin of another
    format (``h.twin(dtype)``, which shares this handler's streams), or of
    this handler.  Between float32 and float64 the conversion rounds
    once; into a half format it rounds the float32 value once, as every
    op rounds on store (so a float64 source rounds to float32 first); a
    value beyond ``dst``'s range becomes inf.  Mixed-precision training uses it to refresh half
    parameters from float32 master weights and to carry half gradients
    into float32.  ``dst`` must not overlap ``src``.
    """
    check_any_format(self, "cast_t", src)
    check_arrays(self, "cast_t", dst)
    _cast_t_row.shape(self, src, dst)
    if self._overlaps(dst, src):
        fail_value("cast_t", "dst must not overlap src")
    if self.read_only_arrays and not (dst.flags.writeable):
        check_writable("cast_t", ('dst',), dst)
    self._cast_t(src, dst)


def fill(self, a, value):
    """Set every element of ``a`` to the scalar ``value``."""
    value = check_scalar("fill", "value", value)
    check_arrays(self, "fill", a)
    if self.read_only_arrays and not (a.flags.writeable):
        check_writable("fill", ('a',), a)
    self._fill(a, value)


_dot_mm_row = PUBLIC['dot_mm']


def dot_mm(self, a, b, out, transa=False, transb=False):
    """out = op(a) @ op(b), where op(x) is x.T if the flag is set, else x.

    Shapes: op(a) (m, k), op(b) (k, n), out (m, n).  ``out`` must not
    overlap ``a`` or ``b``.
    """
    if transa is not False and transa is not True:
        transa = check_flag("dot_mm", "transa", transa)
    if transb is not False and transb is not True:
        transb = check_flag("dot_mm", "transb", transb)
    check_arrays(self, "dot_mm", a, b, out)
    _dot_mm_row.shape(self, a, b, out, transa, transb)
    if self._overlaps(out, a):
        fail_value("dot_mm", "out must not overlap a")
    if self._overlaps(out, b):
        fail_value("dot_mm", "out must not overlap b")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("dot_mm", ('out',), out)
    self._dot(a, b, out, transa, transb, 0.0)


_dot_add_mm_row = PUBLIC['dot_add_mm']


def dot_add_mm(self, a, b, out, transa=False, transb=False):
    """out += op(a) @ op(b); shapes and aliasing as ``dot_mm``."""
    if transa is not False and transa is not True:
        transa = check_flag("dot_add_mm", "transa", transa)
    if transb is not False and transb is not True:
        transb = check_flag("dot_add_mm", "transb", transb)
    check_arrays(self, "dot_add_mm", a, b, out)
    _dot_add_mm_row.shape(self, a, b, out, transa, transb)
    if self._overlaps(out, a):
        fail_value("dot_add_mm", "out must not overlap a")
    if self._overlaps(out, b):
        fail_value("dot_add_mm", "out must not overlap b")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("dot_add_mm", ('out',), out)
    self._dot(a, b, out, transa, transb, 1.0)


_dot_bias_act_row = PUBLIC['dot_bias_act']


def dot_bias_act(self, a, b, bias, out, act=None):
    """out = act(a @ b + bias): a product with its bias and activation.

    Shapes: a (m, k), b (k, n), bias (1, n) (a row, added to every row
    of the product), out (m, n).  ``act`` is None (the bias alone),
    ``"relu"`` or ``"gelu_tanh"`` (GELU's tanh approximation), the
    formulas of ``handlers.activations.FORMULAS``.  PyCudaHandler runs
    it as one cuBLASLt call with the bias and activation in its epilogue
    where cuBLASLt has one for the format and shapes
    (``handlers.cuda.lt``), else as the product and then one fused op;
    in a half format that second way rounds the product to the format
    before the epilogue, so the result carries the product's rounding
    error too (relative to the product, which the bias may cancel),
    where NumpyHandler rounds once.  ``out`` must not overlap
    ``a``, ``b`` or ``bias``.
    """
    check_arrays(self, "dot_bias_act", a, b, bias, out)
    _dot_bias_act_row.shape(self, a, b, bias, out, act)
    if self._overlaps(out, a):
        fail_value("dot_bias_act", "out must not overlap a")
    if self._overlaps(out, b):
        fail_value("dot_bias_act", "out must not overlap b")
    if self._overlaps(out, bias):
        fail_value("dot_bias_act", "out must not overlap bias")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("dot_bias_act", ('out',), out)
    self._dot_bias_act(a, b, bias, out, act)


def axpby(self, alpha, x, beta, y):
    """y = alpha * x + beta * y, for x and y of any one shape.

    ``x`` may be ``y``.  With beta = 0, the old contents of y are ignored
    (NaN in y does not propagate).  ``alpha`` and ``beta`` are numbers, or
    *device scalars*: one-element arrays of this handler, read when the op
    runs (so a replayed graph sees the value they hold then); they must
    not overlap ``y``.
    """
    alpha = check_array_scalar(self, "axpby", "alpha", alpha, y)
    beta = check_array_scalar(self, "axpby", "beta", beta, y)
    check_same_shape(self, "axpby", x, y)
    if self.read_only_arrays and not (y.flags.writeable):
        check_writable("axpby", ('y',), y)
    self._axpby(alpha, x, beta, y)


_adam_update_row = PUBLIC['adam_update']


def adam_update(self, g, lr, beta1, beta2, eps, weight_decay, step, m, v, p, decoupled=False, gate=1.0):
    """One Adam (``decoupled=False``) or AdamW step over p, in one pass.

    With t = step + 1 (``step`` a one-element array counting the steps
    taken, advanced to t by the op itself, on the device):

    * Adam: g' = g + weight_decay * p; AdamW: p = p * (1 - lr * weight_decay), g' = g;
    * m = beta1 * m + (1 - beta1) * g';  v = beta2 * v + (1 - beta2) * g' * g';
    * p = p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps).

    g, m, v and p have one shape; no output overlaps another or g.  ``lr``
    is a finite number >= 0 or a device scalar (read when the op runs, so
    a replayed graph sees its current value; whoever fills it checks it,
    as ``layers.Adam`` does); 0 <= beta1, beta2 < 1, eps > 0,
    weight_decay >= 0, eps and weight_decay finite.  A scalar out of its
    range, NaN or infinite raises ValueError before anything is written.
    Because step lives on the device, a captured
    step replays with the right bias corrections.  ``step`` holds t in the
    handler's dtype: exact up to 2^24 steps in float32.

    ``gate`` (a finite number or a device scalar, 1 by default): where it is 0
    the op changes nothing, not even ``step`` (a skipped step: mixed
    precision's loss scaling passes ``scale_finite_t``'s flag, so that
    no host read decides).
    """
    lr = check_array_scalar(self, "adam_update", "lr", lr, step)
    beta1 = check_scalar("adam_update", "beta1", beta1)
    beta2 = check_scalar("adam_update", "beta2", beta2)
    eps = check_scalar("adam_update", "eps", eps)
    weight_decay = check_scalar("adam_update", "weight_decay", weight_decay)
    gate = check_array_scalar(self, "adam_update", "gate", gate, step)
    if decoupled is not False and decoupled is not True:
        decoupled = check_flag("adam_update", "decoupled", decoupled)
    _adam_update_row.check(lr, beta1, beta2, eps, weight_decay, gate)
    check_arrays(self, "adam_update", g, step, m, v, p)
    _adam_update_row.shape(self, g, lr, step, m, v, p, decoupled, gate)
    self._check_overlaps("adam_update", ('g', 'step', 'm', 'v', 'p'), ((1, 0), (2, 0), (3, 0), (4, 0), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)), (), g, step, m, v, p)
    if self.read_only_arrays and not (step.flags.writeable and m.flags.writeable and v.flags.writeable and p.flags.writeable):
        check_writable("adam_update", ('step', 'm', 'v', 'p'), step, m, v, p)
    self._adam_update(g, lr, beta1, beta2, eps, weight_decay, step, m, v, p, decoupled, gate)


_scale_finite_t_row = PUBLIC['scale_finite_t']


def scale_finite_t(self, a, factor, flag):
    """Unscale gradients and check them, on the device, in one pass.

    ``flag`` (one element) becomes 1 if every element of ``a`` is
    finite, else 0; then each finite element of ``a`` is multiplied by
    ``factor`` (a finite number, ValueError otherwise, or a device
    scalar, which its filler checks) and each NaN or infinite
    one becomes 0, so that an update gated by ``flag`` (``adam_update``'s
    ``gate``) reads finite values either way.  ``flag`` must not overlap
    ``a``, nor ``factor`` either of them.
    """
    factor = check_array_scalar(self, "scale_finite_t", "factor", factor, a)
    _scale_finite_t_row.check(factor)
    check_arrays(self, "scale_finite_t", a, flag)
    _scale_finite_t_row.shape(self, a, factor, flag)
    if self._overlaps(a, flag):
        fail_value("scale_finite_t", "a must not overlap flag")
    if self.read_only_arrays and not (a.flags.writeable and flag.flags.writeable):
        check_writable("scale_finite_t", ('a', 'flag'), a, flag)
    self._scale_finite(a, factor, flag)


_update_loss_scale_row = PUBLIC['update_loss_scale']


def update_loss_scale(self, flag, state, interval, max_scale):
    """Dynamic loss scaling's update, on the device (one thread).

    ``state`` holds four elements: the scale, its inverse, the number of
    finite steps in a row and the number of steps skipped.  ``flag`` (one
    element, ``scale_finite_t``'s) 0: the scale halves, the streak
    restarts at 0 and the skipped count grows by one.  Otherwise the
    streak grows by one, and when it reaches ``interval`` (a whole number
    >= 1, finite) the scale doubles, up to ``max_scale`` (finite and > 0:
    a scale that reached inf would stay inf, as halving inf gives inf),
    and the streak restarts.  The inverse is then 1 / scale, rounded
    once.  A NaN or infinite interval or max_scale raises ValueError.
    ``flag`` must not overlap ``state``.
    """
    interval = check_scalar("update_loss_scale", "interval", interval)
    max_scale = check_scalar("update_loss_scale", "max_scale", max_scale)
    _update_loss_scale_row.check(interval, max_scale)
    check_arrays(self, "update_loss_scale", flag, state)
    _update_loss_scale_row.shape(self, flag, state)
    if self.read_only_arrays and not (state.flags.writeable):
        check_writable("update_loss_scale", ('state',), state)
    self._update_loss_scale(flag, state, interval, max_scale)


_sum_t_row = PUBLIC['sum_t']


def sum_t(self, a, axis, out):
    """Sum ``a`` (rank >= 1) over ``axis`` into ``out``.

    ``axis`` is an int (negative counts from the end), a tuple of distinct
    ints (``sum_t(dy, (0, 2, 3), db)``, a conv bias gradient), or None (all
    axes).  ``out`` has the result's shape, either without the reduced
    axes or with each kept as 1; for ``axis=None``, ``out`` has shape (),
    (1,) or all ones.  ``out`` must not overlap ``a``.
    """
    check_arrays(self, "sum_t", a, out)
    axis = _sum_t_row.shape(self, a, axis, out)
    if self._overlaps(out, a):
        fail_value("sum_t", "out must not overlap a")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("sum_t", ('out',), out)
    self._sum_t(a, axis, out)


_mean_t_row = PUBLIC['mean_t']


def mean_t(self, a, axis, out):
    """Mean of ``a`` over ``axis`` into ``out``: axes and shapes as
    ``sum_t``.  The mean over an empty axis is NaN.  ``out`` must not
    overlap ``a``.
    """
    check_arrays(self, "mean_t", a, out)
    axis = _mean_t_row.shape(self, a, axis, out)
    if self._overlaps(out, a):
        fail_value("mean_t", "out must not overlap a")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("mean_t", ('out',), out)
    self._mean_t(a, axis, out)


_max_t_row = PUBLIC['max_t']


def max_t(self, a, axis, out):
    """Largest element of ``a`` along ``axis`` (one int, negative
    counting from the end) into ``out``, whose shape is ``a``'s without that
    axis or with it kept as 1.  NaN wins: a slice holding NaN gives NaN (and
    ``argmax_t`` the index of its first NaN), as in NumPy.  The axis must not be
    empty.  ``out`` must not overlap ``a``.
    """
    check_arrays(self, "max_t", a, out)
    axis = _max_t_row.shape(self, a, axis, out)
    if self._overlaps(out, a):
        fail_value("max_t", "out must not overlap a")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("max_t", ('out',), out)
    self._extreme_t("max", a, axis, out)


_min_t_row = PUBLIC['min_t']


def min_t(self, a, axis, out):
    """Smallest element of ``a`` along ``axis`` (one int, negative
    counting from the end) into ``out``, whose shape is ``a``'s without that
    axis or with it kept as 1.  NaN wins: a slice holding NaN gives NaN (and
    ``argmax_t`` the index of its first NaN), as in NumPy.  The axis must not be
    empty.  ``out`` must not overlap ``a``.
    """
    check_arrays(self, "min_t", a, out)
    axis = _min_t_row.shape(self, a, axis, out)
    if self._overlaps(out, a):
        fail_value("min_t", "out must not overlap a")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("min_t", ('out',), out)
    self._extreme_t("min", a, axis, out)


_argmax_t_row = PUBLIC['argmax_t']


def argmax_t(self, a, axis, out):
    """Index (as a float) of the largest element, the first of equals, of ``a`` along ``axis`` (one int, negative
    counting from the end) into ``out``, whose shape is ``a``'s without that
    axis or with it kept as 1.  NaN wins: a slice holding NaN gives NaN (and
    ``argmax_t`` the index of its first NaN), as in NumPy.  The axis must not be
    empty.  ``out`` must not overlap ``a``.
    """
    check_arrays(self, "argmax_t", a, out)
    axis = _argmax_t_row.shape(self, a, axis, out)
    if self._overlaps(out, a):
        fail_value("argmax_t", "out must not overlap a")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("argmax_t", ('out',), out)
    self._extreme_t("argmax", a, axis, out)


_add_tt_row = PUBLIC['add_tt']


def add_tt(self, a, b, out):
    """out = a + b.

    Shapes: all arrays of one shape. Aliasing: out may be a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "add_tt", a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("add_tt", ('out',), out)
    self._elementwise(_add_tt_row, a, b, out)


_subtract_tt_row = PUBLIC['subtract_tt']


def subtract_tt(self, a, b, out):
    """out = a - b.

    Shapes: all arrays of one shape. Aliasing: out may be a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "subtract_tt", a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("subtract_tt", ('out',), out)
    self._elementwise(_subtract_tt_row, a, b, out)


_mult_tt_row = PUBLIC['mult_tt']


def mult_tt(self, a, b, out):
    """out = a * b.

    Shapes: all arrays of one shape. Aliasing: out may be a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "mult_tt", a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("mult_tt", ('out',), out)
    self._elementwise(_mult_tt_row, a, b, out)


_divide_tt_row = PUBLIC['divide_tt']


def divide_tt(self, a, b, out):
    """out = a / b (IEEE division: x / 0 is inf or NaN).

    Shapes: all arrays of one shape. Aliasing: out may be a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "divide_tt", a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("divide_tt", ('out',), out)
    self._elementwise(_divide_tt_row, a, b, out)


_mult_add_tt_row = PUBLIC['mult_add_tt']


def mult_add_tt(self, a, b, out):
    """out += a * b.

    Shapes: all arrays of one shape. Aliasing: out may be a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "mult_add_tt", a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("mult_add_tt", ('out',), out)
    self._elementwise(_mult_add_tt_row, a, b, out)


_maximum_tt_row = PUBLIC['maximum_tt']


def maximum_tt(self, a, b, out):
    """out = max(a, b), elementwise; NaN if either is NaN.

    Shapes: all arrays of one shape. Aliasing: out may be a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "maximum_tt", a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("maximum_tt", ('out',), out)
    self._elementwise(_maximum_tt_row, a, b, out)


_minimum_tt_row = PUBLIC['minimum_tt']


def minimum_tt(self, a, b, out):
    """out = min(a, b), elementwise; NaN if either is NaN.

    Shapes: all arrays of one shape. Aliasing: out may be a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "minimum_tt", a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("minimum_tt", ('out',), out)
    self._elementwise(_minimum_tt_row, a, b, out)


_greater_tt_row = PUBLIC['greater_tt']


def greater_tt(self, a, b, out):
    """out = 1 where a > b, else 0 (0 where either is NaN).

    Shapes: all arrays of one shape. Aliasing: out may be a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "greater_tt", a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("greater_tt", ('out',), out)
    self._elementwise(_greater_tt_row, a, b, out)


_equal_tt_row = PUBLIC['equal_tt']


def equal_tt(self, a, b, out):
    """out = 1 where a == b, else 0 (0 where either is NaN).

    Shapes: all arrays of one shape. Aliasing: out may be a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "equal_tt", a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("equal_tt", ('out',), out)
    self._elementwise(_equal_tt_row, a, b, out)


_add_st_row = PUBLIC['add_st']


def add_st(self, s, t, out):
    """out = t + s for a scalar s.

    Shapes: all arrays of one shape. Aliasing: out may be t (the same memory); a partial overlap is undefined.
    """
    s = check_scalar("add_st", "s", s)
    check_same_shape(self, "add_st", t, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("add_st", ('out',), out)
    self._elementwise(_add_st_row, s, t, out)


_mult_st_row = PUBLIC['mult_st']


def mult_st(self, s, t, out):
    """out = s * t for a scalar s.

    Shapes: all arrays of one shape. Aliasing: out may be t (the same memory); a partial overlap is undefined.
    """
    s = check_scalar("mult_st", "s", s)
    check_same_shape(self, "mult_st", t, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("mult_st", ('out',), out)
    self._elementwise(_mult_st_row, s, t, out)


_mult_add_st_row = PUBLIC['mult_add_st']


def mult_add_st(self, s, t, out):
    """out += s * t.

    Shapes: all arrays of one shape. Aliasing: out may be t (the same memory); a partial overlap is undefined.
    """
    s = check_scalar("mult_add_st", "s", s)
    check_same_shape(self, "mult_add_st", t, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("mult_add_st", ('out',), out)
    self._elementwise(_mult_add_st_row, s, t, out)


_pow_st_row = PUBLIC['pow_st']


def pow_st(self, s, t, out):
    """out = t ** s for a scalar exponent s; NaN where t < 0 and s is not an integer.

    Shapes: all arrays of one shape. Aliasing: out may be t (the same memory); a partial overlap is undefined.
    """
    s = check_scalar("pow_st", "s", s)
    check_same_shape(self, "pow_st", t, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("pow_st", ('out',), out)
    self._elementwise(_pow_st_row, s, t, out)


_where_t_row = PUBLIC['where_t']


def where_t(self, cond, a, b, out):
    """out = a where cond != 0, else b (NaN in cond counts as true).

    Shapes: all arrays of one shape. Aliasing: out may be cond or a or b (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "where_t", cond, a, b, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("where_t", ('out',), out)
    self._elementwise(_where_t_row, cond, a, b, out)


_abs_t_row = PUBLIC['abs_t']


def abs_t(self, a, out):
    """out = abs(a), elementwise.

    Shapes: all arrays of one shape. Aliasing: out may be a (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "abs_t", a, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("abs_t", ('out',), out)
    self._elementwise(_abs_t_row, a, out)


_sign_t_row = PUBLIC['sign_t']


def sign_t(self, a, out):
    """out = sign(a): -1, 0 or 1 (0 for NaN is not guaranteed).

    Shapes: all arrays of one shape. Aliasing: out may be a (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "sign_t", a, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("sign_t", ('out',), out)
    self._elementwise(_sign_t_row, a, out)


_square_t_row = PUBLIC['square_t']


def square_t(self, a, out):
    """out = a * a.

    Shapes: all arrays of one shape. Aliasing: out may be a (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "square_t", a, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("square_t", ('out',), out)
    self._elementwise(_square_t_row, a, out)


_sqrt_t_row = PUBLIC['sqrt_t']


def sqrt_t(self, a, out):
    """out = sqrt(a); NaN where a < 0.

    Shapes: all arrays of one shape. Aliasing: out may be a (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "sqrt_t", a, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("sqrt_t", ('out',), out)
    self._elementwise(_sqrt_t_row, a, out)


_rsqrt_t_row = PUBLIC['rsqrt_t']


def rsqrt_t(self, a, out):
    """out = 1 / sqrt(a); inf at 0, NaN where a < 0.

    Shapes: all arrays of one shape. Aliasing: out may be a (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "rsqrt_t", a, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("rsqrt_t", ('out',), out)
    self._elementwise(_rsqrt_t_row, a, out)


_log_t_row = PUBLIC['log_t']


def log_t(self, a, out):
    """out = natural log of a; -inf at 0, NaN where a < 0.

    Shapes: all arrays of one shape. Aliasing: out may be a (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "log_t", a, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("log_t", ('out',), out)
    self._elementwise(_log_t_row, a, out)


_exp_t_row = PUBLIC['exp_t']


def exp_t(self, a, out):
    """out = exp(a).

    Shapes: all arrays of one shape. Aliasing: out may be a (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "exp_t", a, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("exp_t", ('out',), out)
    self._elementwise(_exp_t_row, a, out)


_clip_t_row = PUBLIC['clip_t']


def clip_t(self, a, a_min, a_max, out):
    """out = min(max(a, a_min), a_max); requires a_min <= a_max, neither NaN (either may be infinite: a one-sided clip).

    Shapes: all arrays of one shape. Aliasing: out may be a (the same memory); a partial overlap is undefined.
    """
    a_min = check_scalar("clip_t", "a_min", a_min)
    a_max = check_scalar("clip_t", "a_max", a_max)
    _clip_t_row.check(a_min, a_max)
    check_same_shape(self, "clip_t", a, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("clip_t", ('out',), out)
    self._elementwise(_clip_t_row, a, a_min, a_max, out)


_sigmoid_row = PUBLIC['sigmoid']


def sigmoid(self, x, y):
    """y = 1 / (1 + exp(-x)).

    Shapes: all arrays of one shape. Aliasing: y may be x (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "sigmoid", x, y)
    if self.read_only_arrays and not (y.flags.writeable):
        check_writable("sigmoid", ('y',), y)
    self._elementwise(_sigmoid_row, x, y)


_tanh_row = PUBLIC['tanh']


def tanh(self, x, y):
    """y = tanh(x).

    Shapes: all arrays of one shape. Aliasing: y may be x (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "tanh", x, y)
    if self.read_only_arrays and not (y.flags.writeable):
        check_writable("tanh", ('y',), y)
    self._elementwise(_tanh_row, x, y)


_relu_row = PUBLIC['relu']


def relu(self, x, y):
    """y = max(x, 0).

    Shapes: all arrays of one shape. Aliasing: y may be x (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "relu", x, y)
    if self.read_only_arrays and not (y.flags.writeable):
        check_writable("relu", ('y',), y)
    self._elementwise(_relu_row, x, y)


_elu_row = PUBLIC['elu']


def elu(self, x, y):
    """y = x where x > 0, else exp(x) - 1.

    Shapes: all arrays of one shape. Aliasing: y may be x (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "elu", x, y)
    if self.read_only_arrays and not (y.flags.writeable):
        check_writable("elu", ('y',), y)
    self._elementwise(_elu_row, x, y)


_sigmoid_deriv_row = PUBLIC['sigmoid_deriv']


def sigmoid_deriv(self, x, y, dy, dx):
    """dx = dy * y * (1 - y), with y = sigmoid(x); x is unused but checked.

    Shapes: all arrays of one shape. Aliasing: dx may be y or dy or x (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "sigmoid_deriv", x, y, dy, dx)
    if self.read_only_arrays and not (dx.flags.writeable):
        check_writable("sigmoid_deriv", ('dx',), dx)
    self._elementwise(_sigmoid_deriv_row, x, y, dy, dx)


_tanh_deriv_row = PUBLIC['tanh_deriv']


def tanh_deriv(self, x, y, dy, dx):
    """dx = dy * (1 - y * y), with y = tanh(x); x is unused but checked.

    Shapes: all arrays of one shape. Aliasing: dx may be y or dy or x (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "tanh_deriv", x, y, dy, dx)
    if self.read_only_arrays and not (dx.flags.writeable):
        check_writable("tanh_deriv", ('dx',), dx)
    self._elementwise(_tanh_deriv_row, x, y, dy, dx)


_relu_deriv_row = PUBLIC['relu_deriv']


def relu_deriv(self, x, y, dy, dx):
    """dx = dy where x > 0, else 0; y is unused but checked.

    Shapes: all arrays of one shape. Aliasing: dx may be x or dy or y (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "relu_deriv", x, y, dy, dx)
    if self.read_only_arrays and not (dx.flags.writeable):
        check_writable("relu_deriv", ('dx',), dx)
    self._elementwise(_relu_deriv_row, x, y, dy, dx)


_elu_deriv_row = PUBLIC['elu_deriv']


def elu_deriv(self, x, y, dy, dx):
    """dx = dy where x > 0, else dy * (y + 1).

    Shapes: all arrays of one shape. Aliasing: dx may be x or y or dy (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "elu_deriv", x, y, dy, dx)
    if self.read_only_arrays and not (dx.flags.writeable):
        check_writable("elu_deriv", ('dx',), dx)
    self._elementwise(_elu_deriv_row, x, y, dy, dx)


_copy_to_if_row = PUBLIC['copy_to_if']


def copy_to_if(self, src, dest, cond):
    """dest = src where cond != 0; elsewhere dest keeps its value.

    Shapes: all arrays of one shape. Aliasing: dest may be src or cond (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "copy_to_if", src, dest, cond)
    if self.read_only_arrays and not (dest.flags.writeable):
        check_writable("copy_to_if", ('dest',), dest)
    self._elementwise(_copy_to_if_row, src, dest, cond)


_fill_if_row = PUBLIC['fill_if']


def fill_if(self, mem, val, cond):
    """mem = val where cond != 0; elsewhere mem keeps its value.

    Shapes: all arrays of one shape. Aliasing: mem may be cond (the same memory); a partial overlap is undefined.
    """
    val = check_scalar("fill_if", "val", val)
    check_same_shape(self, "fill_if", mem, cond)
    if self.read_only_arrays and not (mem.flags.writeable):
        check_writable("fill_if", ('mem',), mem)
    self._elementwise(_fill_if_row, mem, val, cond)


_add_into_if_row = PUBLIC['add_into_if']


def add_into_if(self, a, out, cond):
    """out += a where cond != 0; elsewhere out keeps its value.

    Shapes: all arrays of one shape. Aliasing: out may be a or cond (the same memory); a partial overlap is undefined.
    """
    check_same_shape(self, "add_into_if", a, out, cond)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("add_into_if", ('out',), out)
    self._elementwise(_add_into_if_row, a, out, cond)


_broadcast_t_row = PUBLIC['broadcast_t']


def broadcast_t(self, a, axis, out):
    """Repeat ``a`` along ``axis`` into ``out``.

    ``a`` has the shape of ``out`` except for a 1 at ``axis`` (negative
    axes allowed).  ``out`` may be ``a`` where ``out.shape[axis]`` is 1
    (a copy); otherwise they must not overlap.
    """
    check_arrays(self, "broadcast_t", a, out)
    axis = _broadcast_t_row.shape(self, a, axis, out)
    if self._overlaps(out, a) and not self._same_memory(out, a):
        fail_value("broadcast_t", "out must be a or not overlap it")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("broadcast_t", ('out',), out)
    self._broadcast_t(a, axis, out)


_add_mv_row = PUBLIC['add_mv']


def add_mv(self, m, v, out):
    """out = m + v, with v (1, n) broadcast over rows or (m, 1) over columns.
    out may be m.
    """
    check_arrays(self, "add_mv", m, v, out)
    side = _add_mv_row.shape(self, m, v, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("add_mv", ('out',), out)
    self._mv("add", m, v, out, side)


_subtract_mv_row = PUBLIC['subtract_mv']


def subtract_mv(self, m, v, out):
    """out = m - v, v broadcast as in ``add_mv`` (out may be m)."""
    check_arrays(self, "subtract_mv", m, v, out)
    side = _subtract_mv_row.shape(self, m, v, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("subtract_mv", ('out',), out)
    self._mv("sub", m, v, out, side)


_mult_mv_row = PUBLIC['mult_mv']


def mult_mv(self, m, v, out):
    """out = m * v, v broadcast as in ``add_mv`` (out may be m)."""
    check_arrays(self, "mult_mv", m, v, out)
    side = _mult_mv_row.shape(self, m, v, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("mult_mv", ('out',), out)
    self._mv("mul", m, v, out, side)


_divide_mv_row = PUBLIC['divide_mv']


def divide_mv(self, m, v, out):
    """out = m / v, v broadcast as in ``add_mv`` (out may be m)."""
    check_arrays(self, "divide_mv", m, v, out)
    side = _divide_mv_row.shape(self, m, v, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("divide_mv", ('out',), out)
    self._mv("div", m, v, out, side)


_softmax_m_row = PUBLIC['softmax_m']


def softmax_m(self, m, out):
    """Row-wise softmax of the matrix m into out, computed as
    exp(m - rowmax) / rowsum so that large inputs do not overflow.
    Rows must not be empty (m with 0 columns raises ValueError: the
    softmax of nothing is undefined); m may have 0 rows.  out may be m.
    """
    check_arrays(self, "softmax_m", m, out)
    _softmax_m_row.shape(self, m, out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("softmax_m", ('out',), out)
    self._fused(fused_rows.SOFTMAX, m, out)


_index_m_by_v_row = PUBLIC['index_m_by_v']


def index_m_by_v(self, m, v, out):
    """out[i, 0] = m[i, v[i, 0]] for a matrix m (r, c) and index vector v (r, 1).

    v holds indices stored as floats, truncated towards zero.  An index
    whose value is not in [0, c) (NaN included) gives NaN: nothing is read
    out of bounds.  With c = 0 no index is valid and every row gives NaN
    (m is never read).  out has shape (r, 1); it may be v but must not
    overlap m.
    """
    check_arrays(self, "index_m_by_v", m, v, out)
    _index_m_by_v_row.shape(self, m, v, out)
    if self._overlaps(out, m):
        fail_value("index_m_by_v", "out must not overlap m")
    if self._overlaps(out, v) and not self._same_memory(out, v):
        fail_value("index_m_by_v", "out must be v or not overlap it")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("index_m_by_v", ('out',), out)
    self._index_m_by_v(m, v, out)


_binarize_v_row = PUBLIC['binarize_v']


def binarize_v(self, v, out):
    """One-hot encode: out[i, j] = 1 if j == v[i, 0] else 0.

    v (r, 1) holds class indices stored as floats, truncated towards zero;
    out is (r, c).  An index whose value is not in [0, c) (NaN included)
    gives a row of zeros.  out must not overlap v.
    """
    check_arrays(self, "binarize_v", v, out)
    _binarize_v_row.shape(self, v, out)
    if self._overlaps(out, v):
        fail_value("binarize_v", "out must not overlap v")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("binarize_v", ('out',), out)
    self._binarize_v(v, out)


_gather_rows_m_row = PUBLIC['gather_rows_m']


def gather_rows_m(self, table, idx, out):
    """out[i, :] = table[idx[i], :]: rows of ``table`` (vocab, d) picked by
    ``idx`` into ``out`` (n, d).

    ``idx`` has shape (n,) or (n, 1) and holds row indices stored as floats
    (like class labels), truncated towards zero; an index is valid when its
    value is in [0, vocab) (float32 holds whole numbers exactly up to 2**24).
    An invalid index (NaN included): NumpyHandler raises ``ValueError``
    naming the first one, before writing anything; PyCudaHandler, which
    cannot raise from a kernel, writes a row of NaN for it and reads
    nothing out of bounds.  ``out`` must not overlap ``table`` or ``idx``.
    """
    check_arrays(self, "gather_rows_m", table, idx, out)
    _gather_rows_m_row.shape(self, table, idx, out)
    if self._overlaps(out, table):
        fail_value("gather_rows_m", "out must not overlap table")
    if self._overlaps(out, idx):
        fail_value("gather_rows_m", "out must not overlap idx")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("gather_rows_m", ('out',), out)
    self._gather_rows(table, idx, out)


_scatter_add_rows_m_row = PUBLIC['scatter_add_rows_m']


def scatter_add_rows_m(self, a, idx, out):
    """out[idx[i], :] += a[i, :] for i = 0 .. n-1 in order: rows of ``a``
    (n, d) added into the rows of ``out`` (vocab, d) that ``idx`` names
    (the gradient of ``gather_rows_m``; repeated indices add up).

    ``idx`` as in ``gather_rows_m``.  The sums are deterministic, the same
    bits on every run and in captured graphs: each row of ``out`` receives
    its additions in the order of i, never through atomics.  The cost of
    that on a GPU: one thread per column walks all n indices, n dependent
    steps over only d threads, about 0.2 us per index on an H100 whatever
    d (0.84 ms for 4096 indices of 64 columns, where the gather takes
    10 us).  An invalid index:
    NumpyHandler raises ``ValueError`` before adding anything;
    PyCudaHandler skips that row of ``a``.  ``out`` must not overlap ``a``
    or ``idx``.
    """
    check_arrays(self, "scatter_add_rows_m", a, idx, out)
    _scatter_add_rows_m_row.shape(self, a, idx, out)
    if self._overlaps(out, a):
        fail_value("scatter_add_rows_m", "out must not overlap a")
    if self._overlaps(out, idx):
        fail_value("scatter_add_rows_m", "out must not overlap idx")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("scatter_add_rows_m", ('out',), out)
    self._scatter_add_rows(a, idx, out)


_normalize_rows_m_row = PUBLIC['normalize_rows_m']


def normalize_rows_m(self, x, eps, xhat, rstd):
    """Normalize each row of ``x`` (n, d), d >= 1: rstd = 1 / sqrt(var + eps)
    and xhat = (x - mean) * rstd, the mean and the (biased) variance taken
    over the row.  ``rstd`` is (n, 1), ``xhat`` has ``x``'s shape; eps >= 0,
    finite (ValueError otherwise, NaN included).
    Layer normalization's forward pass, before its gain and bias.  The
    outputs must not overlap ``x`` or each other.
    """
    eps = check_scalar("normalize_rows_m", "eps", eps)
    _normalize_rows_m_row.check(eps)
    check_arrays(self, "normalize_rows_m", x, xhat, rstd)
    _normalize_rows_m_row.shape(self, x, xhat, rstd)
    if self._overlaps(xhat, x):
        fail_value("normalize_rows_m", "xhat must not overlap x")
    if self._overlaps(rstd, x):
        fail_value("normalize_rows_m", "rstd must not overlap x")
    if self._overlaps(xhat, rstd):
        fail_value("normalize_rows_m", "xhat must not overlap rstd")
    if self.read_only_arrays and not (xhat.flags.writeable and rstd.flags.writeable):
        check_writable("normalize_rows_m", ('xhat', 'rstd'), xhat, rstd)
    self._fused(fused_rows.NORMALIZE, x, eps, xhat, rstd)


_normalize_rows_backward_m_row = PUBLIC['normalize_rows_backward_m']


def normalize_rows_backward_m(self, xhat, rstd, g, dx):
    """The gradient through ``normalize_rows_m``: given its outputs ``xhat``
    (n, d) and ``rstd`` (n, 1) and g = dL/dxhat (n, d),
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), the means over each
    row.  ``dx`` must not overlap the inputs.
    """
    check_arrays(self, "normalize_rows_backward_m", xhat, rstd, g, dx)
    _normalize_rows_backward_m_row.shape(self, xhat, rstd, g, dx)
    if self._overlaps(dx, xhat):
        fail_value("normalize_rows_backward_m", "dx must not overlap xhat")
    if self._overlaps(dx, rstd):
        fail_value("normalize_rows_backward_m", "dx must not overlap rstd")
    if self._overlaps(dx, g):
        fail_value("normalize_rows_backward_m", "dx must not overlap g")
    if self.read_only_arrays and not (dx.flags.writeable):
        check_writable("normalize_rows_backward_m", ('dx',), dx)
    self._fused(fused_rows.NORMALIZE_BACKWARD, xhat, rstd, g, dx)


_transpose_m_row = PUBLIC['transpose_m']


def transpose_m(self, a, out):
    """out = a.T for a matrix a (r, c) and out (c, r).  out must not overlap a."""
    check_arrays(self, "transpose_m", a, out)
    _transpose_m_row.shape(self, a, out)
    if self._overlaps(out, a):
        fail_value("transpose_m", "out must not overlap a")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("transpose_m", ('out',), out)
    self._transpose_m(a, out)


_permute_t_row = PUBLIC['permute_t']


def permute_t(self, a, axes, out):
    """out = a with its axes reordered: out's axis i is a's axis ``axes[i]``
    (``numpy.transpose``), copied into out's own row-major layout.  a has
    1 to 4 dimensions.  Attention's heads move between (B, T, H, D) and
    (B, H, T, D) so.  out must not overlap a.
    """
    check_arrays(self, "permute_t", a, out)
    axes = _permute_t_row.shape(self, a, axes, out)
    if self._overlaps(out, a):
        fail_value("permute_t", "out must not overlap a")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("permute_t", ('out',), out)
    self._permute_t(a, axes, out)


_concat_t_row = PUBLIC['concat_t']


def concat_t(self, a, b, axis, out):
    """out = a followed by b along ``axis`` (negative counts from the end):
    shapes equal but along ``axis``, where out's length is the sum.  out
    must not overlap a or b.  Chain it for more pieces.
    """
    check_arrays(self, "concat_t", a, b, out)
    axis = _concat_t_row.shape(self, a, b, axis, out)
    if self._overlaps(out, a):
        fail_value("concat_t", "out must not overlap a")
    if self._overlaps(out, b):
        fail_value("concat_t", "out must not overlap b")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("concat_t", ('out',), out)
    self._concat_t(a, b, axis, out)


_split_t_row = PUBLIC['split_t']


def split_t(self, a, axis, out_a, out_b):
    """Cut a in two along ``axis``: out_a gets the first
    ``out_a.shape[axis]`` entries, out_b the rest (shapes as ``concat_t``'s
    with a as the whole).  The outputs must not overlap a or each other.
    """
    check_arrays(self, "split_t", a, out_a, out_b)
    axis = _split_t_row.shape(self, a, axis, out_a, out_b)
    if self._overlaps(out_a, a):
        fail_value("split_t", "out_a must not overlap a")
    if self._overlaps(out_b, a):
        fail_value("split_t", "out_b must not overlap a")
    if self._overlaps(out_a, out_b):
        fail_value("split_t", "out_a must not overlap out_b")
    if self.read_only_arrays and not (out_a.flags.writeable and out_b.flags.writeable):
        check_writable("split_t", ('out_a', 'out_b'), out_a, out_b)
    self._split_t(a, axis, out_a, out_b)


def is_fully_finite(self, a):
    """Return True if no element of ``a`` is NaN or infinite.

    Blocks the host until the check, which is ordered after the work issued
    before it on this group (like any read on this group), has finished.
    """
    self._not_capturing("is_fully_finite")
    check_arrays(self, "is_fully_finite", a)
    return bool(self._is_fully_finite(a))


_fill_gaussian_row = PUBLIC['fill_gaussian']


def fill_gaussian(self, mean, std, out):
    """Fill out with samples from a normal distribution of mean ``mean``
    and standard deviation ``std``: mean finite, std finite and >= 0
    (ValueError otherwise, NaN included).
    """
    mean = check_scalar("fill_gaussian", "mean", mean)
    std = check_scalar("fill_gaussian", "std", std)
    _fill_gaussian_row.check(mean, std)
    check_arrays(self, "fill_gaussian", out)
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("fill_gaussian", ('out',), out)
    self._fill_gaussian(mean, std, out)


_generate_probability_mask_row = PUBLIC['generate_probability_mask']


def generate_probability_mask(self, mask, p):
    """Set each element of mask to 1 with probability p, else to 0 (0 <= p <= 1)."""
    p = check_scalar("generate_probability_mask", "p", p)
    _generate_probability_mask_row.check(p)
    check_arrays(self, "generate_probability_mask", mask)
    if self.read_only_arrays and not (mask.flags.writeable):
        check_writable("generate_probability_mask", ('mask',), mask)
    self._probability_mask(mask, p)


_attention_forward_row = PUBLIC['attention_forward']


def attention_forward(self, q, k, v, out, lse, causal=False, scale=None):
    """Scaled dot-product attention: out = softmax(scale * q @ k^T) @ v.

    q (B, H, T, D) holds the queries of B sequences and H heads, k and v
    (B, H, S, D) the keys and values; out has q's shape.  The softmax runs
    over the S keys of each query; with ``causal`` query t sees keys 0
    to t only (the scores above the diagonal count as -inf; PyTorch's
    ``is_causal``).  ``scale`` defaults to 1 / sqrt(D).  ``lse`` (B, H, T)
    receives each query's log-sum-exp of its scaled, masked scores, all
    that ``attention_backward`` needs of the softmax.  Nothing may be
    empty.  The outputs must not overlap q, k or v.  The default work
    (``handlers.attention``) forms the (B * H, T, S) scores in scratch
    memory the handler keeps per shape and stream group.
    """
    if causal is not False and causal is not True:
        causal = check_flag("attention_forward", "causal", causal)
    check_arrays(self, "attention_forward", q, k, v, out, lse)
    scale = _attention_forward_row.shape(self, q, k, v, out, lse, causal, scale)
    self._check_overlaps("attention_forward", ('q', 'k', 'v', 'out', 'lse'), ((3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2), (3, 4)), (), q, k, v, out, lse)
    if self.read_only_arrays and not (out.flags.writeable and lse.flags.writeable):
        check_writable("attention_forward", ('out', 'lse'), out, lse)
    self._attention_forward(q, k, v, out, lse, causal, scale)


_attention_backward_row = PUBLIC['attention_backward']


def attention_backward(self, q, k, v, out, lse, dout, dq, dk, dv, causal=False, scale=None):
    """The gradients of ``attention_forward``: given its inputs, its ``out``
    and ``lse``, and dout = dL/dout (q's shape), write dq (q's shape), dk
    and dv (k's).  ``causal`` and ``scale`` must be the forward's.  The
    outputs must not overlap the inputs.
    """
    if causal is not False and causal is not True:
        causal = check_flag("attention_backward", "causal", causal)
    check_arrays(self, "attention_backward", q, k, v, out, lse, dout, dq, dk, dv)
    scale = _attention_backward_row.shape(self, q, k, v, out, lse, dout, dq, dk, dv, causal, scale)
    self._check_overlaps("attention_backward", ('q', 'k', 'v', 'out', 'lse', 'dout', 'dq', 'dk', 'dv'), ((6, 0), (6, 1), (6, 2), (6, 3), (6, 4), (6, 5), (7, 0), (7, 1), (7, 2), (7, 3), (7, 4), (7, 5), (8, 0), (8, 1), (8, 2), (8, 3), (8, 4), (8, 5), (6, 7), (6, 8), (7, 8)), (), q, k, v, out, lse, dout, dq, dk, dv)
    if self.read_only_arrays and not (dq.flags.writeable and dk.flags.writeable and dv.flags.writeable):
        check_writable("attention_backward", ('dq', 'dk', 'dv'), dq, dk, dv)
    self._attention_backward(q, k, v, out, lse, dout, dq, dk, dv, causal, scale)


_conv2d_forward_row = PUBLIC['conv2d_forward']


def conv2d_forward(self, x, w, out, stride=1, padding=0, dilation=1):
    """out = the 2-D cross-correlation of x with the filters w (no bias):
    out[n, k, p, q] = sum over c, r, s of
    x[n, c, p*sh - ph + r*dh, q*sw - pw + s*dw] * w[k, c, r, s],
    with x zero outside its bounds (cuDNN's CROSS_CORRELATION mode,
    PyTorch's conv2d).

    Layout NCHW: x (N, C, H, W), w (K, C, R, S) (K output channels, an R x S
    kernel), out/dy (N, K, P, Q) with P = (H + 2*ph - dh*(R-1) - 1) // sh + 1
    and Q likewise from W, S, pw, dw, sw.  ``stride`` (sh, sw), ``padding``
    (ph, pw) and ``dilation`` (dh, dw) are each an int (both axes) or a pair
    (height, width): stride and dilation >= 1, padding >= 0 (zeros), and P, Q
    must be >= 1.  Nothing may be empty: a batch (N), channels (C), filters
    (K), an image (H, W) or a kernel (R, S) of size 0 raises ValueError naming
    it.  out must not overlap x or w.
    """
    check_arrays(self, "conv2d_forward", x, w, out)
    stride, padding, dilation = _conv2d_forward_row.shape(self, x, w, out, stride, padding, dilation)
    if self._overlaps(out, x):
        fail_value("conv2d_forward", "out must not overlap x")
    if self._overlaps(out, w):
        fail_value("conv2d_forward", "out must not overlap w")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("conv2d_forward", ('out',), out)
    self._conv2d("forward", x, w, out, stride, padding, dilation)


_conv2d_bias_act_row = PUBLIC['conv2d_bias_act']


def conv2d_bias_act(self, x, w, bias, out, stride=1, padding=0, dilation=1, act=None):
    """out = act(conv2d_forward(x, w) + bias): a convolution with its
    bias and activation.  bias (K,) holds one value per output channel;
    ``act`` is None (the bias alone), ``"relu"`` or ``"gelu_tanh"``,
    as ``dot_bias_act``'s.  PyCudaHandler runs None and ReLU as one cuDNN
    graph (the convolution, then the bias and activation on its
    unrounded sums) where cuDNN has an engine for it that the engine
    policy allows, else as the convolution and then a fused op per
    image; in a half format that second way rounds the convolution to
    the format first, as ``dot_bias_act``'s does.

    Layout NCHW: x (N, C, H, W), w (K, C, R, S) (K output channels, an R x S
    kernel), out/dy (N, K, P, Q) with P = (H + 2*ph - dh*(R-1) - 1) // sh + 1
    and Q likewise from W, S, pw, dw, sw.  ``stride`` (sh, sw), ``padding``
    (ph, pw) and ``dilation`` (dh, dw) are each an int (both axes) or a pair
    (height, width): stride and dilation >= 1, padding >= 0 (zeros), and P, Q
    must be >= 1.  Nothing may be empty: a batch (N), channels (C), filters
    (K), an image (H, W) or a kernel (R, S) of size 0 raises ValueError naming
    it.  out must not overlap x, w or bias.
    """
    check_arrays(self, "conv2d_bias_act", x, w, bias, out)
    stride, padding, dilation = _conv2d_bias_act_row.shape(self, x, w, bias, out, stride, padding, dilation, act)
    if self._overlaps(out, x):
        fail_value("conv2d_bias_act", "out must not overlap x")
    if self._overlaps(out, w):
        fail_value("conv2d_bias_act", "out must not overlap w")
    if self._overlaps(out, bias):
        fail_value("conv2d_bias_act", "out must not overlap bias")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("conv2d_bias_act", ('out',), out)
    self._conv2d_bias_act(x, w, bias, out, stride, padding, dilation, act)


_conv2d_backward_data_row = PUBLIC['conv2d_backward_data']


def conv2d_backward_data(self, dy, w, dx, stride=1, padding=0, dilation=1):
    """dx = the gradient of ``conv2d_forward``'s output with respect to its
    input x, given the output's gradient dy (overwrites dx).  dx has
    x's shape, which fixes H and W (several sizes give the same
    output size when the stride is above 1; input rows and columns
    that no window reaches get 0).

    Layout NCHW: x (N, C, H, W), w (K, C, R, S) (K output channels, an R x S
    kernel), out/dy (N, K, P, Q) with P = (H + 2*ph - dh*(R-1) - 1) // sh + 1
    and Q likewise from W, S, pw, dw, sw.  ``stride`` (sh, sw), ``padding``
    (ph, pw) and ``dilation`` (dh, dw) are each an int (both axes) or a pair
    (height, width): stride and dilation >= 1, padding >= 0 (zeros), and P, Q
    must be >= 1.  Nothing may be empty: a batch (N), channels (C), filters
    (K), an image (H, W) or a kernel (R, S) of size 0 raises ValueError naming
    it.  dx must not overlap dy or w.
    """
    check_arrays(self, "conv2d_backward_data", dy, w, dx)
    stride, padding, dilation = _conv2d_backward_data_row.shape(self, dy, w, dx, stride, padding, dilation)
    if self._overlaps(dx, dy):
        fail_value("conv2d_backward_data", "dx must not overlap dy")
    if self._overlaps(dx, w):
        fail_value("conv2d_backward_data", "dx must not overlap w")
    if self.read_only_arrays and not (dx.flags.writeable):
        check_writable("conv2d_backward_data", ('dx',), dx)
    self._conv2d("backward_data", dy, w, dx, stride, padding, dilation)


_conv2d_backward_filter_row = PUBLIC['conv2d_backward_filter']


def conv2d_backward_filter(self, x, dy, dw, stride=1, padding=0, dilation=1):
    """dw = the gradient of ``conv2d_forward``'s output with respect to the
    filters w, given the input x and the output's gradient dy
    (overwrites dw; add it to a gradient buffer with ``axpby``).

    Layout NCHW: x (N, C, H, W), w (K, C, R, S) (K output channels, an R x S
    kernel), out/dy (N, K, P, Q) with P = (H + 2*ph - dh*(R-1) - 1) // sh + 1
    and Q likewise from W, S, pw, dw, sw.  ``stride`` (sh, sw), ``padding``
    (ph, pw) and ``dilation`` (dh, dw) are each an int (both axes) or a pair
    (height, width): stride and dilation >= 1, padding >= 0 (zeros), and P, Q
    must be >= 1.  Nothing may be empty: a batch (N), channels (C), filters
    (K), an image (H, W) or a kernel (R, S) of size 0 raises ValueError naming
    it.  dw must not overlap x or dy.
    """
    check_arrays(self, "conv2d_backward_filter", x, dy, dw)
    stride, padding, dilation = _conv2d_backward_filter_row.shape(self, x, dy, dw, stride, padding, dilation)
    if self._overlaps(dw, x):
        fail_value("conv2d_backward_filter", "dw must not overlap x")
    if self._overlaps(dw, dy):
        fail_value("conv2d_backward_filter", "dw must not overlap dy")
    if self.read_only_arrays and not (dw.flags.writeable):
        check_writable("conv2d_backward_filter", ('dw',), dw)
    self._conv2d("backward_filter", x, dy, dw, stride, padding, dilation)


_maxpool2d_forward_row = PUBLIC['maxpool2d_forward']


def maxpool2d_forward(self, x, out, argmax, window, stride=None, padding=0):
    """Max pooling: out[n, c, p, q] = the largest x[n, c, h, w] in window
    (p, q), and argmax[n, c, p, q] its index r * window_w + s within the
    window (row r, column s, counted from the window's first corner,
    padding included), stored as a float (the first of equals in
    row-major order; the first NaN if the window holds one).  Padding
    counts as -inf, so it is never the maximum: every window holds an
    element of x.

    Layout NCHW: x (N, C, H, W); out and argmax (N, C, P, Q).
    ``window`` (wh, ww), ``stride`` (sh, sw) and ``padding`` (ph, pw) are each
    an int (both axes) or a pair (height, width); stride None (the default) is
    the window.  Window and stride >= 1, 0 <=
    padding < window, and P = (H + 2*ph - wh) // sh + 1 (Q likewise) >= 1.
    A batch (N) or channels (C) of size 0 raises ValueError naming it.
    Windows may overlap (stride < window).  out and argmax must not overlap x or each other.
    """
    check_arrays(self, "maxpool2d_forward", x, out, argmax)
    window, stride, padding = _maxpool2d_forward_row.shape(self, x, out, argmax, window, stride, padding)
    if self._overlaps(out, x):
        fail_value("maxpool2d_forward", "out must not overlap x")
    if self._overlaps(argmax, x):
        fail_value("maxpool2d_forward", "argmax must not overlap x")
    if self._overlaps(out, argmax):
        fail_value("maxpool2d_forward", "out must not overlap argmax")
    if self.read_only_arrays and not (out.flags.writeable and argmax.flags.writeable):
        check_writable("maxpool2d_forward", ('out', 'argmax'), out, argmax)
    self._pool2d("max", x, out, argmax, window, stride, padding)


_maxpool2d_backward_row = PUBLIC['maxpool2d_backward']


def maxpool2d_backward(self, argmax, dy, dx, window, stride=None, padding=0):
    """Gradient of ``maxpool2d_forward``: dx[n, c, h, w] = the sum of
    dy[n, c, p, q] over the windows (p, q) whose argmax names (h, w)
    (overwrites dx; an argmax naming nothing in x adds nothing).  Each
    element of dx gathers from the windows that contain it, so the
    result is deterministic.  argmax is the forward's, with the same
    window, stride and padding.

    Layout NCHW: argmax and dy (N, C, P, Q); dx (N, C, H, W).
    ``window`` (wh, ww), ``stride`` (sh, sw) and ``padding`` (ph, pw) are each
    an int (both axes) or a pair (height, width); stride None (the default) is
    the window.  Window and stride >= 1, 0 <=
    padding < window, and P = (H + 2*ph - wh) // sh + 1 (Q likewise) >= 1.
    A batch (N) or channels (C) of size 0 raises ValueError naming it.
    Windows may overlap (stride < window).  dx must not overlap argmax or dy.
    """
    check_arrays(self, "maxpool2d_backward", argmax, dy, dx)
    window, stride, padding = _maxpool2d_backward_row.shape(self, argmax, dy, dx, window, stride, padding)
    if self._overlaps(dx, argmax):
        fail_value("maxpool2d_backward", "dx must not overlap argmax")
    if self._overlaps(dx, dy):
        fail_value("maxpool2d_backward", "dx must not overlap dy")
    if self.read_only_arrays and not (dx.flags.writeable):
        check_writable("maxpool2d_backward", ('dx',), dx)
    self._pool2d("max_backward", dy, dx, argmax, window, stride, padding)


_avgpool2d_forward_row = PUBLIC['avgpool2d_forward']


def avgpool2d_forward(self, x, out, window, stride=None, padding=0):
    """Average pooling: out[n, c, p, q] = the mean of the elements of x in
    window (p, q), padding excluded: the sum over the part of the
    window inside x, divided by that part's size (cuDNN's
    AVERAGE_COUNT_EXCLUDE_PADDING, PyTorch's count_include_pad=False).

    Layout NCHW: x (N, C, H, W); out (N, C, P, Q).
    ``window`` (wh, ww), ``stride`` (sh, sw) and ``padding`` (ph, pw) are each
    an int (both axes) or a pair (height, width); stride None (the default) is
    the window.  Window and stride >= 1, 0 <=
    padding < window, and P = (H + 2*ph - wh) // sh + 1 (Q likewise) >= 1.
    A batch (N) or channels (C) of size 0 raises ValueError naming it.
    Windows may overlap (stride < window).  out must not overlap x.
    """
    check_arrays(self, "avgpool2d_forward", x, out)
    window, stride, padding = _avgpool2d_forward_row.shape(self, x, out, window, stride, padding)
    if self._overlaps(out, x):
        fail_value("avgpool2d_forward", "out must not overlap x")
    if self.read_only_arrays and not (out.flags.writeable):
        check_writable("avgpool2d_forward", ('out',), out)
    self._pool2d("avg", x, out, None, window, stride, padding)


_avgpool2d_backward_row = PUBLIC['avgpool2d_backward']


def avgpool2d_backward(self, dy, dx, window, stride=None, padding=0):
    """Gradient of ``avgpool2d_forward``: dx[n, c, h, w] = the sum of
    dy[n, c, p, q] / count(p, q) over the windows (p, q) that contain
    (h, w), count being the window's size inside x (overwrites dx;
    deterministic, as for max pooling).

    Layout NCHW: dy (N, C, P, Q); dx (N, C, H, W).
    ``window`` (wh, ww), ``stride`` (sh, sw) and ``padding`` (ph, pw) are each
    an int (both axes) or a pair (height, width); stride None (the default) is
    the window.  Window and stride >= 1, 0 <=
    padding < window, and P = (H + 2*ph - wh) // sh + 1 (Q likewise) >= 1.
    A batch (N) or channels (C) of size 0 raises ValueError naming it.
    Windows may overlap (stride < window).  dx must not overlap dy.
    """
    check_arrays(self, "avgpool2d_backward", dy, dx)
    window, stride, padding = _avgpool2d_backward_row.shape(self, dy, dx, window, stride, padding)
    if self._overlaps(dx, dy):
        fail_value("avgpool2d_backward", "dx must not overlap dy")
    if self.read_only_arrays and not (dx.flags.writeable):
        check_writable("avgpool2d_backward", ('dx',), dx)
    self._pool2d("avg_backward", dy, dx, None, window, stride, padding)
