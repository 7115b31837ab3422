"""The op table: every fact about every op of the contract, in one place.

Each row (:class:`Op`) names an op's parameters in signature order and says,
for each array, whether the op reads it, writes it or only checks it; which
inputs an output must not overlap at all (any other input may be the very
same memory as the output, decided on memory ranges, but must not partially
overlap it); and, for the elementwise family, the kernel it launches and its
NumPy expression.  From the table come:

* ``Handler``'s public op methods (``handlers.base.install_ops``), each with the row's
  signature and docstring: the scalar and flag checks, the op's extra rule
  on its scalars, the arrays' type, dtype and contiguity, the shape rule
  (one shape for all, or a rule of ``handlers.shape_rules``), the overlap
  checks (``disjoint``, ``exact``), then the backend call;
* each kernel's argument format (:data:`KERNELS`), which
  ``tests/test_optable.py`` checks against its signature in the ``.cu``
  source, and which PyCudaHandler loads the kernels with;
* the ops of the compiled one-call path (``one_call.py``);
* DebugHandler's per-op effects (reads, writes, aliasing, NaN checks).

Parameter tokens (the ``params`` string of a row), in signature order: ``a`` an
array the op reads; ``out=`` an array it writes; ``out+=`` one it reads and
writes (accumulating and masked ops); ``x~`` an array it checks but never
reads; ``src^`` an array it reads that may be of another format than the
handler's (``cast_t``: an array of a twin, see ``Handler.twin``), and
``out^=`` one it writes (a fused op's output declared ``^``); ``#s`` a real
scalar; ``$s`` a real scalar or a device scalar (a one-element array of the
handler, read when the op runs); ``?f`` a bool flag, False by default;
``@axis`` a parameter left to the shape rule (an axis, a stride), and
``@stride:1`` or ``$gate:1.0`` one with a default value (a Python literal;
parameters with defaults come last). An elementwise kernel takes the parameters in the same
order, arrays as pointers and scalars in the handler's precision, then the
element count.

Adding an elementwise op is one :func:`ew` row below, plus its functor and
one ``SH_*`` line in ``kernels/elementwise.cu`` (docs: "Adding an op").
"""
from __future__ import annotations

import inspect
import itertools
import math
import os
import re

import numpy as np

from . import shape_rules as rules
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

__all__ = ["ELEMENTWISE", "KERNELS", "OPS", "PUBLIC", "Op", "ew",
           "kernel_format"]


class Op:
    """One op of the contract: its parameters, how it touches memory, and how
    its public method validates them and calls the backend.

    ``kind`` is one of ``"op"`` (issued on the caller's stream group: reads
    ``reads`` and writes ``writes``), ``"alloc"`` (returns a new array, ready
    on every group), ``"host_read"`` (the host reads the arrays of ``reads``,
    including the work of every group), ``"view"`` (a new array object over
    existing memory, issuing nothing) or ``"stream"`` (ordering, or no
    handler array).  ``unused`` are arrays checked but never read (the
    aliasing rule still applies); ``disjoint`` the inputs an output must not
    overlap at all; ``exact`` the inputs it may overlap only as the very same
    memory, which the handler checks (for the other inputs a partial overlap
    is undefined, and DebugHandler reports it); ``unread_if`` maps a read
    argument to a predicate on the bound arguments under which its old
    contents are ignored; ``finite`` whether ``check_finite`` applies.

    Rows with a public method made here (``shape`` set) also have: ``doc``
    (its docstring); ``shape``, ``"same"`` (all arrays of one shape) or a
    rule from ``handlers.shape_rules`` whose result is bound to the name
    ``gives``; ``check``, an extra rule on the checked scalars; ``call``, the
    backend call (Python source over the parameters); ``blocking``, whether
    the op waits for the device (so it is refused inside a capture and
    returns the call's result).  Elementwise rows (``kernel`` set) have
    ``numpy``, a function ``(handler, *args)`` computing the op in place.
    """

    __slots__ = ("any_format", "blocking", "call", "check", "defaults", "device_scalars",
                 "disjoint", "doc",
                 "exact", "finite", "flags", "gives", "kernel", "kind", "name", "numpy", "out",
                 "params", "reads", "scalars", "shape", "unread_if", "unused", "writes")

    def __init__(self, name, params="", kind="op", disjoint=(), exact=(), unread_if=None,
                 finite=True, kernel=None, numpy=None, doc="", check=None, shape=None,
                 gives=None, call=None, blocking=False):
        self.name, self.kind = name, kind
        self.params, reads, writes, unused, scalars, flags = [], [], [], [], [], []
        any_format, device_scalars = [], []
        self.defaults = {}   # parameter -> its default, as source text (``@stride:1``)
        for token in params.split():
            if token[0] in "#$?@":
                # scalar, scalar or device scalar, bool flag, rule parameter
                arg = token[1:]
                if token[0] in "@$" and ":" in arg:
                    arg, self.defaults[arg.split(":")[0]] = arg.split(":", 1)
                self.params.append(arg)
                if token[0] in "#$":
                    scalars.append(arg)
                    if token[0] == "$":
                        device_scalars.append(arg)
                elif token[0] == "?":
                    flags.append(arg)
                continue
            arg = token.rstrip("=+~^")
            self.params.append(arg)
            if "^" in token:   # src^ (read) or out^= (written): of any format
                any_format.append(arg)
            if token.endswith("^"):
                reads.append(arg)
            elif token.endswith("+="):
                reads.append(arg)
                writes.append(arg)
            elif token.endswith("="):
                writes.append(arg)
            elif token.endswith("~"):
                unused.append(arg)
            else:
                reads.append(arg)
        self.params = tuple(self.params)
        self.reads, self.writes, self.unused = tuple(reads), tuple(writes), tuple(unused)
        self.scalars, self.flags = tuple(scalars), tuple(flags)
        self.any_format = tuple(any_format)
        # Device scalars ($): the public method accepts one-element arrays too.
        self.device_scalars = tuple(device_scalars)
        self.disjoint, self.exact = tuple(disjoint), tuple(exact)
        self.unread_if, self.finite = unread_if or {}, finite
        self.kernel, self.numpy, self.doc, self.check = kernel, numpy, doc, check
        self.shape, self.gives, self.blocking = shape, gives, blocking
        self.call = call or (f"_elementwise(OP, {', '.join(self.params)})" if kernel else None)
        # Position of the (first) output: its size is the kernel's element count.
        self.out = self.params.index(self.writes[0]) if self.writes else None

    @property
    def arrays(self):
        """Names of all array arguments, inputs first, each once."""
        return tuple(dict.fromkeys(self.reads + self.unused + self.writes))

    def describe(self):
        """One line on the op's memory effects (DebugHandler's docstrings)."""
        if self.kind == "alloc":
            return "the new array counts as written and ready on every stream group."
        if self.kind == "host_read":
            return (f"reads {', '.join(self.reads)} on the host; includes the work of "
                    f"every group, so it is an ordering point for that memory.")
        parts = []
        if self.reads:
            parts.append("reads " + ", ".join(self.reads))
        if self.writes:
            parts.append("writes " + ", ".join(self.writes))
        if self.disjoint:
            parts.append("output must not overlap " + ", ".join(self.disjoint))
        return "; ".join(parts) + " on this view's stream group."

    def aliasing(self):
        """The aliasing sentence of an elementwise op's docstring."""
        out = self.writes[0]
        ins = [n for n in self.arrays if n not in self.writes]
        if not ins:
            return ""
        return (f"{out} may be {' or '.join(ins)} (the same memory); a partial overlap is "
                f"undefined.")


def _is_zero(value):
    # The handler's own scalar rule; a value it rejects is never "zero".
    try:
        return check_scalar("axpby", "beta", value) == 0.0
    except TypeError:
        return False


def _add_product(h, fn, a, b, out):
    # out += fn(a, b), through the handler's scratch buffer of out's shape.
    tmp = h._scratch(out.shape)
    fn(a, b, out=tmp)
    np.add(out, tmp, out=out)


def _sigmoid(h, x, y):
    # 0.5 * (1 + tanh(x / 2)) never overflows, unlike 1 / (1 + exp(-x)).
    np.multiply(x, 0.5, out=y)
    np.tanh(y, out=y)
    np.add(y, 1.0, out=y)
    np.multiply(y, 0.5, out=y)


def _elu(h, x, y):
    tmp = h._scratch(y.shape)
    np.minimum(x, 0.0, out=tmp)
    np.expm1(tmp, out=tmp)
    np.maximum(x, 0.0, out=y)
    np.add(y, tmp, out=y)


def _deriv(factor):
    """dx = dy * factor(x, y, tmp), the factor computed into scratch."""
    def run(h, x, y, dy, dx):
        tmp = h._scratch(dx.shape)
        factor(x, y, tmp)
        np.multiply(dy, tmp, out=dx)
    return run


def _elu_factor(x, y, tmp):
    np.add(y, 1.0, out=tmp)
    np.copyto(tmp, 1.0, where=x > 0.0)


def _sigmoid_factor(x, y, tmp):
    np.subtract(1.0, y, out=tmp)
    np.multiply(tmp, y, out=tmp)


def _tanh_factor(x, y, tmp):
    np.multiply(y, y, out=tmp)
    np.subtract(1.0, tmp, out=tmp)


def _rsqrt(h, a, out):
    np.sqrt(a, out=out)
    np.divide(1.0, out, out=out)


def _nan_aware(fn):
    # numpy.maximum/minimum propagate NaN, as the kernels do.
    return lambda h, a, b, out: fn(a, b, out=out)


def _where(h, cond, a, b, out):
    pick = cond != 0          # NaN counts as true, as in numpy (NaN != 0)
    if out is b or np.may_share_memory(out, b):
        np.copyto(out, a, where=pick)   # out holds b already (the same memory)
    else:
        np.copyto(out, b, where=~pick)
        np.copyto(out, a, where=pick)


# The scalar rules (``Op.check``).  They run on Python floats and are written
# so that NaN fails them: every comparison with NaN is False, so each test is
# phrased as "not (good range)", never as "bad value".
_INF = math.inf


def _clip_rule(a_min, a_max):
    for name, bound in (("a_min", a_min), ("a_max", a_max)):
        if bound != bound:
            fail_value("clip_t", f"{name} must be a number (-inf and inf allowed), not NaN, "
                                 f"got {bound}")
    if a_min > a_max:
        fail_value("clip_t", f"a_min {a_min} is greater than a_max {a_max}")


_EXTREME_DOC = """{what} of ``a`` along ``axis`` (one int, negative
counting from the end) into ``out``, whose shape is ``a``'s without that
axis or with it kept as 1.  NaN wins: a slice holding NaN gives NaN (and
``argmax_t`` the index of its first NaN), as in NumPy.  The axis must not be
empty.  ``out`` must not overlap ``a``."""


def check_adam_hyperparameters(op, beta1, beta2, eps, weight_decay):
    """Raise ValueError naming ``op`` unless 0 <= beta1, beta2 < 1, eps > 0
    and weight_decay >= 0, eps and weight_decay finite (NaN fails every
    test): ``adam_update``'s rule, which the optimizers (``layers.Adam``)
    apply at construction too.  The arguments are floats."""
    for name, beta in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 <= beta < 1.0:
            fail_value(op, f"{name} must be in [0, 1), got {beta}")
    if not 0.0 < eps < _INF:
        fail_value(op, f"eps must be finite and > 0, got {eps}")
    if not 0.0 <= weight_decay < _INF:
        fail_value(op, f"weight_decay must be finite and >= 0, got {weight_decay}")


def _adam_rule(lr, beta1, beta2, eps, weight_decay, gate):
    # lr and gate as device scalars are checked by whoever fills them (the
    # optimizers, the loss scaling).
    if type(lr) is float and not 0.0 <= lr < _INF:
        fail_value("adam_update", f"lr must be finite and >= 0, got {lr}")
    if type(gate) is float and not -_INF < gate < _INF:
        fail_value("adam_update", f"gate must be finite, got {gate}")
    check_adam_hyperparameters("adam_update", beta1, beta2, eps, weight_decay)


def _factor_rule(factor):
    # A device-scalar factor is checked by whoever fills it (the loss scaling).
    if type(factor) is float and not -_INF < factor < _INF:
        fail_value("scale_finite_t", f"factor must be finite, got {factor}")


def _loss_scale_rule(interval, max_scale):
    # Finite first: int() of NaN or inf would raise its own, unrelated error.
    if not 1.0 <= interval < _INF or interval != int(interval):
        fail_value("update_loss_scale", f"interval must be a finite whole number >= 1, "
                                        f"got {interval}")
    if not 0.0 < max_scale < _INF:
        fail_value("update_loss_scale", f"max_scale must be finite and > 0 (a scale that "
                                        f"reached inf would stay inf), got {max_scale}")


def _eps_rule(eps):
    if not 0.0 <= eps < _INF:
        fail_value("normalize_rows_m", f"eps must be finite and >= 0, got {eps}")


def _std_rule(mean, std):
    if not -_INF < mean < _INF:
        fail_value("fill_gaussian", f"mean must be finite, got {mean}")
    if not 0.0 <= std < _INF:
        fail_value("fill_gaussian", f"std must be finite and >= 0, got {std}")


def _p_rule(p):
    if not 0.0 <= p <= 1.0:
        fail_value("generate_probability_mask", f"p must be in [0, 1], got {p}")


_CONV_DOC = """{what}

Layout NCHW: x (N, C, H, W), w (K, C, R, S) (K output channels, an R x S
kernel), out/dy (N, K, P, Q) with P = (H + 2*ph - dh*(R-1) - 1) // sh + 1
and Q likewise from W, S, pw, dw, sw.  ``stride`` (sh, sw), ``padding``
(ph, pw) and ``dilation`` (dh, dw) are each an int (both axes) or a pair
(height, width): stride and dilation >= 1, padding >= 0 (zeros), and P, Q
must be >= 1.  Nothing may be empty: a batch (N), channels (C), filters
(K), an image (H, W) or a kernel (R, S) of size 0 raises ValueError naming
it.  {alias}"""

_POOL_DOC = """{what}

Layout NCHW: {arrays}
``window`` (wh, ww), ``stride`` (sh, sw) and ``padding`` (ph, pw) are each
an int (both axes) or a pair (height, width); stride None (the default) is
the window.  Window and stride >= 1, 0 <=
padding < window, and P = (H + 2*ph - wh) // sh + 1 (Q likewise) >= 1.
A batch (N) or channels (C) of size 0 raises ValueError naming it.
Windows may overlap (stride < window).  {alias}"""


def ew(name, params, kernel, numpy, doc, check=None):
    """A row of the elementwise family: same-shape arrays, one kernel.  (NaN,
    inf and division by zero are results, never warnings: NumpyHandler runs
    every op with NumPy's warnings off.)"""
    return Op(name, params, kernel=kernel, numpy=numpy, doc=doc, check=check, shape="same")


def _op(name, params, **kw):
    return Op(name, params, **kw)


_S = "stream"

#: op name -> Op, for every public op of ``Handler``.
OPS = {op.name: op for op in [
    # ---------------------------------------------------------------- streams and life
    *(Op(n, kind=_S) for n in ("with_streams", "record_event", "wait_event", "wait_for",
                               "synchronize", "synchronize_all_streams", "capture", "close",
                               "pin", "prefetch", "empty_pinned", "twin",
                               "random_state", "set_random_state")),
    # ---------------------------------------------------------------- memory
    Op("allocate", kind="alloc", finite=False),   # undefined contents: may hold NaN
    Op("zeros", kind="alloc", finite=False),      # finite by construction
    Op("ones", kind="alloc", finite=False),
    Op("create_from_numpy", kind="alloc"),
    Op("create_from_device_array", kind="alloc", finite=False),   # another library's memory
    # Views: a new array object over existing memory; no work, no effect on it.
    Op("reshape_t", "a~", kind="view"),
    Op("view_t", "a~", kind="view"),
    Op("get_numpy_copy", "a", kind="host_read", finite=False),
    _op("get_numpy_copy_async", "a", finite=False),   # a read on this group; out is host
    _op("set_from_numpy", "a="),
    _op("copy_to", "src dest=", shape="same", call="_copy_to(src, dest)",
        doc="Copy ``src`` into ``dest`` (same shape).  They must not partially overlap."),
    _op("cast_t", "src^ dst=", disjoint=("src",), shape=rules.cast_t, call="_cast_t(src, dst)",
        doc="""dst = src converted to this handler's format, rounded once.

        ``src`` has ``dst``'s shape and may be of any format the handler's
        class holds (``supported_dtypes``): an array of a twin of another
        format (``h.twin(dtype)``, which shares this handler's streams), or of
        this handler.  Between float32 and float64 the conversion rounds
        once; into a half format it rounds the float32 value once, as every
        op rounds on store (so a float64 source rounds to float32 first); a
        value beyond ``dst``'s range becomes inf.  Mixed-precision training uses it to refresh half
        parameters from float32 master weights and to carry half gradients
        into float32.  ``dst`` must not overlap ``src``."""),
    _op("fill", "a= #value", shape="any", call="_fill(a, value)",
        doc="Set every element of ``a`` to the scalar ``value``."),
    # ---------------------------------------------------------------- BLAS and reductions
    _op("dot_mm", "a b out= ?transa ?transb", disjoint=("a", "b"),
        shape=rules.dot("dot_mm"), call="_dot(a, b, out, transa, transb, 0.0)",
        doc="""out = op(a) @ op(b), where op(x) is x.T if the flag is set, else x.

        Shapes: op(a) (m, k), op(b) (k, n), out (m, n).  ``out`` must not
        overlap ``a`` or ``b``."""),
    _op("dot_add_mm", "a b out+= ?transa ?transb", disjoint=("a", "b"),
        shape=rules.dot("dot_add_mm"), call="_dot(a, b, out, transa, transb, 1.0)",
        doc="out += op(a) @ op(b); shapes and aliasing as ``dot_mm``."),
    _op("dot_bias_act", "a b bias out= @act:None", disjoint=("a", "b", "bias"),
        shape=rules.dot_bias_act, call="_dot_bias_act(a, b, bias, out, act)",
        doc="""out = act(a @ b + bias): a product with its bias and activation.

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
        ``a``, ``b`` or ``bias``."""),
    _op("axpby", "$alpha x $beta y+=", unread_if={"y": lambda args: _is_zero(args.get("beta"))},
        kernel="axpby", shape="same", call="_axpby(alpha, x, beta, y)",
        doc="""y = alpha * x + beta * y, for x and y of any one shape.

        ``x`` may be ``y``.  With beta = 0, the old contents of y are ignored
        (NaN in y does not propagate).  ``alpha`` and ``beta`` are numbers, or
        *device scalars*: one-element arrays of this handler, read when the op
        runs (so a replayed graph sees the value they hold then); they must
        not overlap ``y``."""),
    _op("adam_update",
        "g $lr #beta1 #beta2 #eps #weight_decay step+= m+= v+= p+= ?decoupled $gate:1.0",
        disjoint=("g",), shape=rules.adam_update, check=_adam_rule,
        call="_adam_update(g, lr, beta1, beta2, eps, weight_decay, step, m, v, p, decoupled, "
             "gate)",
        doc="""One Adam (``decoupled=False``) or AdamW step over p, in one pass.

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
        no host read decides)."""),
    _op("scale_finite_t", "a+= $factor flag=", shape=rules.scale_finite_t, check=_factor_rule,
        call="_scale_finite(a, factor, flag)",
        doc="""Unscale gradients and check them, on the device, in one pass.

        ``flag`` (one element) becomes 1 if every element of ``a`` is
        finite, else 0; then each finite element of ``a`` is multiplied by
        ``factor`` (a finite number, ValueError otherwise, or a device
        scalar, which its filler checks) and each NaN or infinite
        one becomes 0, so that an update gated by ``flag`` (``adam_update``'s
        ``gate``) reads finite values either way.  ``flag`` must not overlap
        ``a``, nor ``factor`` either of them."""),
    _op("update_loss_scale", "flag state+= #interval #max_scale",
        shape=rules.update_loss_scale, check=_loss_scale_rule,
        call="_update_loss_scale(flag, state, interval, max_scale)",
        doc="""Dynamic loss scaling's update, on the device (one thread).

        ``state`` holds four elements: the scale, its inverse, the number of
        finite steps in a row and the number of steps skipped.  ``flag`` (one
        element, ``scale_finite_t``'s) 0: the scale halves, the streak
        restarts at 0 and the skipped count grows by one.  Otherwise the
        streak grows by one, and when it reaches ``interval`` (a whole number
        >= 1, finite) the scale doubles, up to ``max_scale`` (finite and > 0:
        a scale that reached inf would stay inf, as halving inf gives inf),
        and the streak restarts.  The inverse is then 1 / scale, rounded
        once.  A NaN or infinite interval or max_scale raises ValueError.
        ``flag`` must not overlap ``state``."""),
    _op("sum_t", "a @axis out=", disjoint=("a",), shape=rules.reduction("sum_t"), gives="axis",
        call="_sum_t(a, axis, out)",
        doc="""Sum ``a`` (rank >= 1) over ``axis`` into ``out``.

        ``axis`` is an int (negative counts from the end), a tuple of distinct
        ints (``sum_t(dy, (0, 2, 3), db)``, a conv bias gradient), or None (all
        axes).  ``out`` has the result's shape, either without the reduced
        axes or with each kept as 1; for ``axis=None``, ``out`` has shape (),
        (1,) or all ones.  ``out`` must not overlap ``a``."""),
    _op("mean_t", "a @axis out=", disjoint=("a",), shape=rules.reduction("mean_t"), gives="axis",
        call="_mean_t(a, axis, out)",
        doc="""Mean of ``a`` over ``axis`` into ``out``: axes and shapes as
        ``sum_t``.  The mean over an empty axis is NaN.  ``out`` must not
        overlap ``a``."""),
    *(_op(name, "a @axis out=", disjoint=("a",), shape=rules.extreme(name), gives="axis",
          call=f'_extreme_t("{kind}", a, axis, out)', doc=doc) for name, kind, doc in [
        ("max_t", "max", _EXTREME_DOC.format(what="Largest element")),
        ("min_t", "min", _EXTREME_DOC.format(what="Smallest element")),
        ("argmax_t", "argmax", _EXTREME_DOC.format(what="Index (as a float) of the largest "
                                                        "element, the first of equals,"))]),
    # ---------------------------------------------------------------- elementwise
    ew("add_tt", "a b out=", "binary_add", lambda h, a, b, out: np.add(a, b, out=out),
       "out = a + b."),
    ew("subtract_tt", "a b out=", "binary_sub",
       lambda h, a, b, out: np.subtract(a, b, out=out), "out = a - b."),
    ew("mult_tt", "a b out=", "binary_mul", lambda h, a, b, out: np.multiply(a, b, out=out),
       "out = a * b."),
    ew("divide_tt", "a b out=", "binary_div", lambda h, a, b, out: np.divide(a, b, out=out),
       "out = a / b (IEEE division: x / 0 is inf or NaN)."),
    ew("mult_add_tt", "a b out+=", "binary_mul_add",
       lambda h, a, b, out: _add_product(h, np.multiply, a, b, out), "out += a * b."),
    ew("maximum_tt", "a b out=", "binary_max", _nan_aware(np.maximum),
       "out = max(a, b), elementwise; NaN if either is NaN."),
    ew("minimum_tt", "a b out=", "binary_min", _nan_aware(np.minimum),
       "out = min(a, b), elementwise; NaN if either is NaN."),
    ew("greater_tt", "a b out=", "binary_greater",
       lambda h, a, b, out: np.greater(a, b, out=out),
       "out = 1 where a > b, else 0 (0 where either is NaN)."),
    ew("equal_tt", "a b out=", "binary_equal", lambda h, a, b, out: np.equal(a, b, out=out),
       "out = 1 where a == b, else 0 (0 where either is NaN)."),
    ew("add_st", "#s t out=", "scalar_add", lambda h, s, t, out: np.add(t, s, out=out),
       "out = t + s for a scalar s."),
    ew("mult_st", "#s t out=", "scalar_mul", lambda h, s, t, out: np.multiply(t, s, out=out),
       "out = s * t for a scalar s."),
    ew("mult_add_st", "#s t out+=", "scalar_mul_add",
       lambda h, s, t, out: _add_product(h, np.multiply, t, s, out), "out += s * t."),
    ew("pow_st", "#s t out=", "scalar_pow", lambda h, s, t, out: np.power(t, s, out=out),
       "out = t ** s for a scalar exponent s; NaN where t < 0 and s is not an integer."),
    ew("where_t", "cond a b out=", "where",
       _where, "out = a where cond != 0, else b (NaN in cond counts as true)."),
    ew("abs_t", "a out=", "unary_abs", lambda h, a, out: np.abs(a, out=out),
       "out = abs(a), elementwise."),
    ew("sign_t", "a out=", "unary_sign", lambda h, a, out: np.sign(a, out=out),
       "out = sign(a): -1, 0 or 1 (0 for NaN is not guaranteed)."),
    ew("square_t", "a out=", "unary_square", lambda h, a, out: np.multiply(a, a, out=out),
       "out = a * a."),
    ew("sqrt_t", "a out=", "unary_sqrt", lambda h, a, out: np.sqrt(a, out=out),
       "out = sqrt(a); NaN where a < 0."),
    ew("rsqrt_t", "a out=", "unary_rsqrt", _rsqrt,
       "out = 1 / sqrt(a); inf at 0, NaN where a < 0."),
    ew("log_t", "a out=", "unary_log", lambda h, a, out: np.log(a, out=out),
       "out = natural log of a; -inf at 0, NaN where a < 0."),
    ew("exp_t", "a out=", "unary_exp", lambda h, a, out: np.exp(a, out=out),
       "out = exp(a)."),
    ew("clip_t", "a #a_min #a_max out=", "clip",
       lambda h, a, a_min, a_max, out: np.clip(a, a_min, a_max, out=out),
       "out = min(max(a, a_min), a_max); requires a_min <= a_max, neither NaN (either may "
       "be infinite: a one-sided clip).", check=_clip_rule),
    # ---------------------------------------------------------------- activations
    ew("sigmoid", "x y=", "unary_sigmoid", _sigmoid, "y = 1 / (1 + exp(-x))."),
    ew("tanh", "x y=", "unary_tanh", lambda h, x, y: np.tanh(x, out=y), "y = tanh(x)."),
    ew("relu", "x y=", "unary_relu", lambda h, x, y: np.maximum(x, 0.0, out=y),
       "y = max(x, 0)."),
    ew("elu", "x y=", "unary_elu", _elu, "y = x where x > 0, else exp(x) - 1."),
    # each derivative reads what its formula uses
    ew("sigmoid_deriv", "x~ y dy dx=", "deriv_sigmoid", _deriv(_sigmoid_factor),
       "dx = dy * y * (1 - y), with y = sigmoid(x); x is unused but checked."),
    ew("tanh_deriv", "x~ y dy dx=", "deriv_tanh", _deriv(_tanh_factor),
       "dx = dy * (1 - y * y), with y = tanh(x); x is unused but checked."),
    ew("relu_deriv", "x y~ dy dx=", "deriv_relu",
       _deriv(lambda x, y, tmp: np.greater(x, 0.0, out=tmp)),
       "dx = dy where x > 0, else 0; y is unused but checked."),
    ew("elu_deriv", "x y dy dx=", "deriv_elu", _deriv(_elu_factor),
       "dx = dy where x > 0, else dy * (y + 1)."),
    # ---------------------------------------------------------------- masks
    ew("copy_to_if", "src dest+= cond", "copy_if",
       lambda h, src, dest, cond: np.copyto(dest, src, where=cond != 0),
       "dest = src where cond != 0; elsewhere dest keeps its value."),
    ew("fill_if", "mem+= #val cond", "fill_if",
       lambda h, mem, val, cond: np.copyto(mem, val, where=cond != 0),
       "mem = val where cond != 0; elsewhere mem keeps its value."),
    ew("add_into_if", "a out+= cond", "add_if",
       lambda h, a, out, cond: np.add(out, a, out=out, where=cond != 0),
       "out += a where cond != 0; elsewhere out keeps its value."),
    # ---------------------------------------------------------------- other shapes
    # out.shape[axis] == 1 makes broadcast_t a copy, where out may be a;
    # otherwise a is smaller than out, so any overlap is partial and raises.
    _op("broadcast_t", "a @axis out=", exact=("a",), shape=rules.broadcast_t, gives="axis",
        call="_broadcast_t(a, axis, out)",
        doc="""Repeat ``a`` along ``axis`` into ``out``.

        ``a`` has the shape of ``out`` except for a 1 at ``axis`` (negative
        axes allowed).  ``out`` may be ``a`` where ``out.shape[axis]`` is 1
        (a copy); otherwise they must not overlap."""),
    *(_op(f"{name}_mv", "m v out=", shape=rules.mv(f"{name}_mv"), gives="side",
          call=f'_mv("{kernel}", m, v, out, side)', doc=doc) for name, kernel, doc in [
        ("add", "add", "out = m + v, with v (1, n) broadcast over rows or (m, 1) over "
                       "columns.\nout may be m."),
        ("subtract", "sub", "out = m - v, v broadcast as in ``add_mv`` (out may be m)."),
        ("mult", "mul", "out = m * v, v broadcast as in ``add_mv`` (out may be m)."),
        ("divide", "div", "out = m / v, v broadcast as in ``add_mv`` (out may be m)."),
    ]),
    _op("softmax_m", "m out=", shape=rules.softmax_m, call="_fused(fused_rows.SOFTMAX, m, out)",
        doc="""Row-wise softmax of the matrix m into out, computed as
        exp(m - rowmax) / rowsum so that large inputs do not overflow.
        Rows must not be empty (m with 0 columns raises ValueError: the
        softmax of nothing is undefined); m may have 0 rows.  out may be m."""),
    _op("index_m_by_v", "m v out=", disjoint=("m",), exact=("v",), shape=rules.index_m_by_v,
        call="_index_m_by_v(m, v, out)",
        doc="""out[i, 0] = m[i, v[i, 0]] for a matrix m (r, c) and index vector v (r, 1).

        v holds indices stored as floats, truncated towards zero.  An index
        whose value is not in [0, c) (NaN included) gives NaN: nothing is read
        out of bounds.  With c = 0 no index is valid and every row gives NaN
        (m is never read).  out has shape (r, 1); it may be v but must not
        overlap m."""),
    _op("binarize_v", "v out=", disjoint=("v",), shape=rules.binarize_v,
        call="_binarize_v(v, out)",
        doc="""One-hot encode: out[i, j] = 1 if j == v[i, 0] else 0.

        v (r, 1) holds class indices stored as floats, truncated towards zero;
        out is (r, c).  An index whose value is not in [0, c) (NaN included)
        gives a row of zeros.  out must not overlap v."""),
    # Embedding lookups and their gradient.  An index is checked on its value
    # (a data-dependent check): NumpyHandler raises, a GPU kernel cannot, so
    # there an invalid index gives NaN (gather) or is skipped (scatter-add).
    _op("gather_rows_m", "table idx out=", disjoint=("table", "idx"),
        shape=rules.rows_by_index("gather_rows_m", "out"), call="_gather_rows(table, idx, out)",
        doc="""out[i, :] = table[idx[i], :]: rows of ``table`` (vocab, d) picked by
        ``idx`` into ``out`` (n, d).

        ``idx`` has shape (n,) or (n, 1) and holds row indices stored as floats
        (like class labels), truncated towards zero; an index is valid when its
        value is in [0, vocab) (float32 holds whole numbers exactly up to 2**24).
        An invalid index (NaN included): NumpyHandler raises ``ValueError``
        naming the first one, before writing anything; PyCudaHandler, which
        cannot raise from a kernel, writes a row of NaN for it and reads
        nothing out of bounds.  ``out`` must not overlap ``table`` or ``idx``."""),
    _op("scatter_add_rows_m", "a idx out+=", disjoint=("a", "idx"),
        shape=rules.rows_by_index("scatter_add_rows_m", "a"),
        call="_scatter_add_rows(a, idx, out)",
        doc="""out[idx[i], :] += a[i, :] for i = 0 .. n-1 in order: rows of ``a``
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
        or ``idx``."""),
    # LayerNorm's row work, each a single kernel where the general ops take
    # 9 (forward) and 10 (backward) launches.
    _op("normalize_rows_m", "x #eps xhat= rstd=", disjoint=("x",), check=_eps_rule,
        shape=rules.normalize_rows_m, call="_fused(fused_rows.NORMALIZE, x, eps, xhat, rstd)",
        doc="""Normalize each row of ``x`` (n, d), d >= 1: rstd = 1 / sqrt(var + eps)
        and xhat = (x - mean) * rstd, the mean and the (biased) variance taken
        over the row.  ``rstd`` is (n, 1), ``xhat`` has ``x``'s shape; eps >= 0,
        finite (ValueError otherwise, NaN included).
        Layer normalization's forward pass, before its gain and bias.  The
        outputs must not overlap ``x`` or each other."""),
    _op("normalize_rows_backward_m", "xhat rstd g dx=", disjoint=("xhat", "rstd", "g"),
        shape=rules.normalize_rows_backward_m,
        call="_fused(fused_rows.NORMALIZE_BACKWARD, xhat, rstd, g, dx)",
        doc="""The gradient through ``normalize_rows_m``: given its outputs ``xhat``
        (n, d) and ``rstd`` (n, 1) and g = dL/dxhat (n, d),
        dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), the means over each
        row.  ``dx`` must not overlap the inputs."""),
    _op("transpose_m", "a out=", disjoint=("a",), shape=rules.transpose_m,
        call="_transpose_m(a, out)",
        doc="""out = a.T for a matrix a (r, c) and out (c, r).  out must not overlap a."""),
    _op("permute_t", "a @axes out=", disjoint=("a",), shape=rules.permute_t, gives="axes",
        call="_permute_t(a, axes, out)",
        doc="""out = a with its axes reordered: out's axis i is a's axis ``axes[i]``
        (``numpy.transpose``), copied into out's own row-major layout.  a has
        1 to 4 dimensions.  Attention's heads move between (B, T, H, D) and
        (B, H, T, D) so.  out must not overlap a."""),
    _op("concat_t", "a b @axis out=", disjoint=("a", "b"), shape=rules.concat_t, gives="axis",
        call="_concat_t(a, b, axis, out)",
        doc="""out = a followed by b along ``axis`` (negative counts from the end):
        shapes equal but along ``axis``, where out's length is the sum.  out
        must not overlap a or b.  Chain it for more pieces."""),
    _op("split_t", "a @axis out_a= out_b=", disjoint=("a",), shape=rules.split_t, gives="axis",
        call="_split_t(a, axis, out_a, out_b)",
        doc="""Cut a in two along ``axis``: out_a gets the first
        ``out_a.shape[axis]`` entries, out_b the rest (shapes as ``concat_t``'s
        with a as the whole).  The outputs must not overlap a or each other."""),
    # Runs on the caller's group and blocks the host; a read on the group.
    _op("is_fully_finite", "a", finite=False, shape="any", blocking=True,
        call="_is_fully_finite(a)",
        doc="""Return True if no element of ``a`` is NaN or infinite.

        Blocks the host until the check, which is ordered after the work issued
        before it on this group (like any read on this group), has finished."""),
    _op("fill_gaussian", "#mean #std out=", shape="any", check=_std_rule,
        call="_fill_gaussian(mean, std, out)",
        doc="""Fill out with samples from a normal distribution of mean ``mean``
        and standard deviation ``std``: mean finite, std finite and >= 0
        (ValueError otherwise, NaN included)."""),
    _op("generate_probability_mask", "mask= #p", shape="any", check=_p_rule,
        call="_probability_mask(mask, p)",
        doc="Set each element of mask to 1 with probability p, else to 0 (0 <= p <= 1)."),
    # ---------------------------------------------------------------- attention
    _op("attention_forward", "q k v out= lse= ?causal @scale:None",
        disjoint=("q", "k", "v"), shape=rules.attention_forward, gives="scale",
        call="_attention_forward(q, k, v, out, lse, causal, scale)",
        doc="""Scaled dot-product attention: out = softmax(scale * q @ k^T) @ v.

        q (B, H, T, D) holds the queries of B sequences and H heads, k and v
        (B, H, S, D) the keys and values; out has q's shape.  The softmax runs
        over the S keys of each query; with ``causal`` query t sees keys 0
        to t only (the scores above the diagonal count as -inf; PyTorch's
        ``is_causal``).  ``scale`` defaults to 1 / sqrt(D).  ``lse`` (B, H, T)
        receives each query's log-sum-exp of its scaled, masked scores, all
        that ``attention_backward`` needs of the softmax.  Nothing may be
        empty.  The outputs must not overlap q, k or v.  The default work
        (``handlers.attention``) forms the (B * H, T, S) scores in scratch
        memory the handler keeps per shape and stream group."""),
    _op("attention_backward",
        "q k v out lse dout dq= dk= dv= ?causal @scale:None",
        disjoint=("q", "k", "v", "out", "lse", "dout"), shape=rules.attention_backward,
        gives="scale",
        call="_attention_backward(q, k, v, out, lse, dout, dq, dk, dv, causal, scale)",
        doc="""The gradients of ``attention_forward``: given its inputs, its ``out``
        and ``lse``, and dout = dL/dout (q's shape), write dq (q's shape), dk
        and dv (k's).  ``causal`` and ``scale`` must be the forward's.  The
        outputs must not overlap the inputs."""),
    # ---------------------------------------------------------------- convolution and pooling
    _op("conv2d_forward", "x w out= @stride:1 @padding:0 @dilation:1", disjoint=("x", "w"),
        shape=rules.conv2d("conv2d_forward"), gives="stride, padding, dilation",
        call='_conv2d("forward", x, w, out, stride, padding, dilation)', doc=_CONV_DOC.format(
            what="out = the 2-D cross-correlation of x with the filters w (no bias):\n"
                 "out[n, k, p, q] = sum over c, r, s of\n"
                 "x[n, c, p*sh - ph + r*dh, q*sw - pw + s*dw] * w[k, c, r, s],\n"
                 "with x zero outside its bounds (cuDNN's CROSS_CORRELATION mode,\n"
                 "PyTorch's conv2d).",
            alias="out must not overlap x or w.")),
    _op("conv2d_bias_act", "x w bias out= @stride:1 @padding:0 @dilation:1 @act:None",
        disjoint=("x", "w", "bias"), shape=rules.conv2d_bias_act,
        gives="stride, padding, dilation",
        call="_conv2d_bias_act(x, w, bias, out, stride, padding, dilation, act)",
        doc=_CONV_DOC.format(
            what="out = act(conv2d_forward(x, w) + bias): a convolution with its\n"
                 "bias and activation.  bias (K,) holds one value per output channel;\n"
                 "``act`` is None (the bias alone), ``\"relu\"`` or ``\"gelu_tanh\"``,\n"
                 "as ``dot_bias_act``'s.  PyCudaHandler runs None and ReLU as one cuDNN\n"
                 "graph (the convolution, then the bias and activation on its\n"
                 "unrounded sums) where cuDNN has an engine for it that the engine\n"
                 "policy allows, else as the convolution and then a fused op per\n"
                 "image; in a half format that second way rounds the convolution to\n"
                 "the format first, as ``dot_bias_act``'s does.",
            alias="out must not overlap x, w or bias.")),
    _op("conv2d_backward_data", "dy w dx= @stride:1 @padding:0 @dilation:1",
        disjoint=("dy", "w"), shape=rules.conv2d("conv2d_backward_data"),
        gives="stride, padding, dilation",
        call='_conv2d("backward_data", dy, w, dx, stride, padding, dilation)',
        doc=_CONV_DOC.format(
            what="dx = the gradient of ``conv2d_forward``'s output with respect to its\n"
                 "input x, given the output's gradient dy (overwrites dx).  dx has\n"
                 "x's shape, which fixes H and W (several sizes give the same\n"
                 "output size when the stride is above 1; input rows and columns\n"
                 "that no window reaches get 0).",
            alias="dx must not overlap dy or w.")),
    _op("conv2d_backward_filter", "x dy dw= @stride:1 @padding:0 @dilation:1",
        disjoint=("x", "dy"), shape=rules.conv2d("conv2d_backward_filter"),
        gives="stride, padding, dilation",
        call='_conv2d("backward_filter", x, dy, dw, stride, padding, dilation)',
        doc=_CONV_DOC.format(
            what="dw = the gradient of ``conv2d_forward``'s output with respect to the\n"
                 "filters w, given the input x and the output's gradient dy\n"
                 "(overwrites dw; add it to a gradient buffer with ``axpby``).",
            alias="dw must not overlap x or dy.")),
    _op("maxpool2d_forward", "x out= argmax= @window @stride:None @padding:0",
        disjoint=("x",), shape=rules.pool2d("maxpool2d_forward"),
        gives="window, stride, padding",
        call='_pool2d("max", x, out, argmax, window, stride, padding)',
        doc=_POOL_DOC.format(
            what="Max pooling: out[n, c, p, q] = the largest x[n, c, h, w] in window\n"
                 "(p, q), and argmax[n, c, p, q] its index r * window_w + s within the\n"
                 "window (row r, column s, counted from the window's first corner,\n"
                 "padding included), stored as a float (the first of equals in\n"
                 "row-major order; the first NaN if the window holds one).  Padding\n"
                 "counts as -inf, so it is never the maximum: every window holds an\n"
                 "element of x.",
            arrays="x (N, C, H, W); out and argmax (N, C, P, Q).",
            alias="out and argmax must not overlap x or each other.")),
    _op("maxpool2d_backward", "argmax dy dx= @window @stride:None @padding:0",
        disjoint=("argmax", "dy"), shape=rules.pool2d("maxpool2d_backward"),
        gives="window, stride, padding",
        call='_pool2d("max_backward", dy, dx, argmax, window, stride, padding)',
        doc=_POOL_DOC.format(
            what="Gradient of ``maxpool2d_forward``: dx[n, c, h, w] = the sum of\n"
                 "dy[n, c, p, q] over the windows (p, q) whose argmax names (h, w)\n"
                 "(overwrites dx; an argmax naming nothing in x adds nothing).  Each\n"
                 "element of dx gathers from the windows that contain it, so the\n"
                 "result is deterministic.  argmax is the forward's, with the same\n"
                 "window, stride and padding.",
            arrays="argmax and dy (N, C, P, Q); dx (N, C, H, W).",
            alias="dx must not overlap argmax or dy.")),
    _op("avgpool2d_forward", "x out= @window @stride:None @padding:0",
        disjoint=("x",), shape=rules.pool2d("avgpool2d_forward"),
        gives="window, stride, padding",
        call='_pool2d("avg", x, out, None, window, stride, padding)',
        doc=_POOL_DOC.format(
            what="Average pooling: out[n, c, p, q] = the mean of the elements of x in\n"
                 "window (p, q), padding excluded: the sum over the part of the\n"
                 "window inside x, divided by that part's size (cuDNN's\n"
                 "AVERAGE_COUNT_EXCLUDE_PADDING, PyTorch's count_include_pad=False).",
            arrays="x (N, C, H, W); out (N, C, P, Q).",
            alias="out must not overlap x.")),
    _op("avgpool2d_backward", "dy dx= @window @stride:None @padding:0",
        disjoint=("dy",), shape=rules.pool2d("avgpool2d_backward"),
        gives="window, stride, padding",
        call='_pool2d("avg_backward", dy, dx, None, window, stride, padding)',
        doc=_POOL_DOC.format(
            what="Gradient of ``avgpool2d_forward``: dx[n, c, h, w] = the sum of\n"
                 "dy[n, c, p, q] / count(p, q) over the windows (p, q) that contain\n"
                 "(h, w), count being the window's size inside x (overwrites dx;\n"
                 "deterministic, as for max pooling).",
            arrays="dy (N, C, P, Q); dx (N, C, H, W).",
            alias="dx must not overlap dy.")),
]}

#: The elementwise rows: same-shape arrays, one kernel and a NumPy expression.
ELEMENTWISE = {name: op for name, op in OPS.items() if op.numpy is not None}
#: The rows that get a public method (``handlers/generated_ops.py``).
PUBLIC = {name: op for name, op in OPS.items() if op.shape is not None}


def kernel_format(op, T):
    """The argument format of an elementwise row's kernel: its parameters in
    order (``P`` for an array, ``T`` for a scalar), then ``q`` for n."""
    return "".join(T if p in op.scalars else "P" for p in op.params) + "q"


#: kernel -> (source file in handlers/cuda/kernels, argument format).  Formats use
#: ``T`` for a scalar of the handler's dtype; the elementwise rows' formats are
#: derived from the rows.  ``_f32``/``_f64`` name the two instantiations.
KERNELS = {
    **{op.kernel: ("elementwise", kernel_format(op, "T")) for op in OPS.values()
       if op.kernel},
    "fill": ("elementwise", "PTq"),
    "axpby_dev": ("elementwise", "PTPPTPq"),
    "adam": ("optim", "PPTTTTTPPPPqiPPT"),
    "scale_finite": ("optim", "PPTPq"),
    "loss_scale": ("optim", "PPTT"),
    **{f"mv_{o}_{side}": ("elementwise", "PPPqq") for o in ("add", "sub", "mul", "div")
       for side in ("row", "col")},
    "broadcast": ("elementwise", "PPqqq"),
    "all_finite": ("elementwise", "PqP"),
    "index_m_by_v": ("rows", "PPPqq"),
    "binarize_v": ("rows", "PPqq"),
    "gather_rows": ("rows", "PPPqqq"),
    "scatter_add_rows": ("rows", "PPPqqqq"),
    "fill_gaussian": ("random", "PqTTQQP"),
    "probability_mask": ("random", "PqTQQP"),
    "rng_advance": ("random", "PQ"),
    # the reduction engine (reduce.cu): sums, max and min (the value alone)
    # and argmax ("pick": a value and its 32-bit index; "pick64" where the
    # reduced extent needs a 64-bit one); every sum kernel but the
    # general ones (sum_gen*: GenArgs's 22 ints after the column kernel's
    # arguments) also writes the compute format (NAME_wide), the others only T
    **{f"{family}_{kind}{wide}": ("reduce", fmt)
       for kinds, fmt in ((("thread", "stride", "walk", "lanes", "short", "slab", "rows", "long"),
                           "PPPPqqqqqi"),
                          (("cols", "cols_vec"), "PPPPqqqqqqii"),
                          (("mid", "mid_vec"), "PPPPqqqqqq"))
       for kind in kinds for family in ("sum", "max", "min", "pick", "pick64")
       if family == "sum" or kind[0] != "m"
       for wide in (("", "_wide") if family == "sum" else ("",))},
    **{f"sum_{kind}": ("reduce", "PPPPqqqqqqii" + "i" * 22) for kind in ("gen", "gen_vec")},
    # nothing to reduce (every reduced axis of extent 1): max and min copy
    # the input, a sum adds it to +0.0, argmax ("pick") writes 0; n after
    # the four pointers
    **{f"{family}_one": ("reduce", "PPPPq") for family in ("sum", "max", "min", "pick")},
    "small_gemm": ("small_gemm", "PPPqqqiii"),
    "transpose": ("layout", "PPqq"),
    "copy2d": ("layout", "PPqqqqqq"),
    "permute": ("layout", "PPq" + "q" * 2 * 4 + "i"),
    **{f"cast_from_{src}": ("layout", "PPq") for src in ("f32", "f64", "bf16", "f16")},
    "add_compute": ("elementwise", "PPq"),
    "widen": ("elementwise", "PPq"),
    "narrow": ("elementwise", "PTPq"),
    "scatter_add_rows_wide": ("rows", "PPPqqqq"),
    # fused attention for the half formats (attention.cu; head sizes 32 and 64)
    **{f"attn_{kind}_d{d}": ("attention", fmt) for d in (32, 64)
       for kind, fmt in (("fwd", "PPPPPqqqiT"), ("bwd_q", "PPPPPPPPqqqiT"),
                         ("bwd_kv", "PPPPPPPqqqiT"))},
    "pool_fwd": ("pool", "PPPqqqqqiiiiiii"),
    "pool_bwd": ("pool", "PPPqqqqqiiiiiii"),
}


def _method_source(op, checks_only=False, row="OP"):
    """The source of an op's public method: checks in a fixed order, then
    the backend call (see :class:`Op`); with ``checks_only``, the checks
    alone, returning the call's arguments (scalars as floats) instead.
    ``row`` is the name under which the method sees its ``Op``."""
    name, out = op.name, (op.writes or ("None",))[0]
    sig = ", ".join(f"{p}=False" if p in op.flags
                    else f"{p}={op.defaults[p]}" if p in op.defaults else p
                    for p in op.params)
    body = []
    if op.blocking:
        body.append(f'self._not_capturing("{name}")')
    for s in op.scalars:
        if s in op.device_scalars:
            body.append(f'{s} = check_array_scalar(self, "{name}", "{s}", {s}, {out})')
        else:
            body.append(f'{s} = check_scalar("{name}", "{s}", {s})')
    for f in op.flags:   # the common case costs two identity tests
        body.append(f'if {f} is not False and {f} is not True:\n'
                    f'        {f} = check_flag("{name}", "{f}", {f})')
    if op.check:
        body.append(f"{row}.check({', '.join(op.scalars)})")
    arrays = ", ".join(p for p in op.params if p in op.arrays and p not in op.any_format)
    for p in op.any_format:
        body.append(f'check_any_format(self, "{name}", {p})')
    if op.shape == "same":
        body.append(f'check_same_shape(self, "{name}", {arrays})')
    else:
        body.append(f'check_arrays(self, "{name}", {arrays})')
    if callable(op.shape):   # device scalars go to the rule (overlap checks), numbers do not
        args = ", ".join(p for p in op.params
                         if p not in op.scalars or p in op.device_scalars)
        body.append(f"{op.gives + ' = ' if op.gives else ''}{row}.shape(self, {args})")
    disjoint = [(w, d) for w in op.writes for d in op.disjoint]
    disjoint += itertools.combinations(op.writes, 2)     # several outputs: all disjoint
    exact = [(w, e) for w in op.writes for e in op.exact]   # every output (fused ops: several)
    if len(disjoint) + len(exact) <= _INLINE_OVERLAP_CHECKS:
        for w, d in disjoint:
            body.append(f'if self._overlaps({w}, {d}):\n'
                        f'        fail_value("{name}", "{w} must not overlap {d}")')
        for w, e in exact:
            body.append(f'if self._overlaps({w}, {e}) and not self._same_memory({w}, {e}):\n'
                        f'        fail_value("{name}", "{w} must be {e} or not overlap it")')
    else:   # many rules (fused ops): each array's memory range taken once
        names = tuple(p for p in op.params if p in op.arrays)
        at = {p: i for i, p in enumerate(names)}
        pairs = [tuple((at[a], at[b]) for a, b in rule) for rule in (disjoint, exact)]
        body.append(f'self._check_overlaps("{name}", {names!r}, {tuple(pairs[0])!r}, '
                    f'{tuple(pairs[1])!r}, {", ".join(names)})')
    if op.writes:   # NumpyHandler: an output may be read-only memory
        writable = " and ".join(f"{w}.flags.writeable" for w in op.writes)
        body.append(f'if self.read_only_arrays and not ({writable}):\n'
                    f'        check_writable("{name}", {op.writes!r}, {", ".join(op.writes)})')
    if checks_only:
        body.append(f"return ({', '.join(op.params)},)")
    else:
        call = re.sub(r"\bOP\b", row, op.call)
        body.append(f"return bool(self.{call})" if op.blocking else f"self.{call}")
    return f"def {name}(self, {sig}):\n    " + "\n    ".join(body) + "\n"


#: Up to this many overlap rules are checked inline, pair by pair (the common
#: ops: one or two rules, no call); more go to one ``Handler._check_overlaps``
#: call that takes each array's memory range once (a fused LSTM step has 112).
_INLINE_OVERLAP_CHECKS = 6

#: The names a made method sees besides its parameters (``_method``); a
#: parameter must not take one of them (``handlers.fused`` checks its names).
#: The check functions a made method calls, by name (``_method``'s namespace,
#: ``generated_source``'s import list).
_CHECKS = {f.__name__: f for f in (check_any_format, check_array_scalar, check_arrays,
                                    check_flag, check_same_shape, check_scalar,
                                    check_writable, fail_value)}
METHOD_NAMES = frozenset({"self", "OP", "FUSED", "bool", *_CHECKS})


def _method(op, checks_only=False, **extra):
    """Build the method of a row declared at run time, a user's fused op (by
    source, so that it has the row's real signature and no per-call
    overhead).  ``extra`` adds names its ``call`` uses (the declaration,
    ``FUSED``); ``checks_only`` builds the checks alone (``_method_source``).
    The contract's own ops are not built here: they are written out in
    ``handlers/generated_ops.py`` (``generated_source``)."""
    namespace = {"OP": op, **_CHECKS, **extra}
    exec(compile(_method_source(op, checks_only), f"<optable {op.name}>", "exec"), namespace)
    fn = namespace[op.name]
    fn.__doc__ = _docstring(op)
    return fn


def _docstring(op):
    """The docstring of a row's method."""
    if op.kernel and op.numpy:
        return f"{op.doc}\n\nShapes: all arrays of one shape. Aliasing: {op.aliasing()}"
    return inspect.cleandoc(op.doc)


#: Where the contract's op methods are written out (``generated_source``).
GENERATED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated_ops.py")


def generated_source():
    """The text of ``handlers/generated_ops.py``: one function per row with a
    ``shape`` (every op that takes arrays and issues work), checks in a
    fixed order then the backend call, as ``_method_source`` writes them.
    ``python -m handlers.generate`` writes the file; a test fails when it is
    out of date."""
    head = ['"""The contract\'s array ops, one function per row of ``handlers.optable``',
            "with a shape rule; ``Handler`` takes them as its methods (``base.install_ops``).",
            "",
            "Written by ``python -m handlers.generate`` from the table: do not edit by",
            "hand, change the table and run that (``tests/test_optable.py`` fails while",
            'this file is out of date)."""',
            "from . import fused_rows",
            "from .checks import (",
            *(f"    {n}," for n in sorted(_CHECKS)),
            ")",
            "from .optable import PUBLIC",
            ""]
    parts = []
    for name, op in PUBLIC.items():
        row = f"_{name}_row"
        src = _method_source(op, row=row)
        doc = _docstring(op).replace("\\", "\\\\")
        if '"""' in doc or doc.endswith('"'):
            raise ValueError(f"{name}: its docstring cannot be written between triple quotes")
        doc = "\n".join(("    " + line) if line and i else line
                        for i, line in enumerate(doc.split("\n")))
        first, rest = src.split("\n", 1)
        close = '"""' if "\n" not in doc else '\n    """'
        parts.append((f"{row} = PUBLIC[{name!r}]\n\n\n" if row in src else "")
                     + f'{first}\n    """{doc}{close}\n{rest}')
    return "\n".join(head) + "\n\n" + "\n\n".join(parts)
