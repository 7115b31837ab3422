"""The op table: every fact about every op of the contract, in one place.

Each row (:class:`Op`) names an op's parameters in signature order and says,
for each array, whether the op reads it, writes it or only checks it; which
inputs an output must not overlap at all (any other input may be the very
same memory as the output, decided on memory ranges, but must not partially
overlap it); and, for the elementwise family, the kernel it launches and its
NumPy expression.  From the table come:

* ``Handler``'s public elementwise methods (:func:`install`): the scalar
  checks, the same-shape check, the op's own extra rule, then the backend
  hook ``_elementwise(op, *args)``;
* each kernel's argument format (:data:`KERNELS`), which
  ``tests/test_optable.py`` checks against its signature in the ``.cu``
  source, and which PyCudaHandler loads the kernels with;
* the ops of the compiled one-call path (``one_call.py``);
* DebugHandler's per-op effects (reads, writes, aliasing, NaN checks).

Parameter tokens (the ``params`` string of a row), in signature order:
``a`` an array the op reads; ``out=`` an array it writes; ``out+=`` one it
reads and writes (accumulating and masked ops); ``x~`` an array it checks but
never reads; ``#s`` a real scalar.  An elementwise kernel takes the
parameters in the same order, arrays as pointers and scalars in the
handler's precision, then the element count.

Adding an elementwise op is one :func:`ew` row below, plus its functor and
one ``SH_*`` line in ``kernels/elementwise.cu`` (docs: "Adding an op").
"""
from __future__ import annotations

import numpy as np

from .checks import check_scalar, fail_value

__all__ = ["ELEMENTWISE", "KERNELS", "OPS", "Op", "ew", "install", "kernel_format"]


class Op:
    """One op of the contract and how it touches memory.

    ``kind`` is one of ``"op"`` (issued on the caller's stream group: reads
    ``reads`` and writes ``writes``), ``"alloc"`` (returns a new array, ready
    on every group), ``"host_read"`` (the host reads the arrays of ``reads``,
    including the work of every group) or ``"stream"`` (ordering, or no
    handler array).  ``unused`` are arrays checked but never read (the
    aliasing rule still applies); ``disjoint`` the inputs an output must not
    overlap at all; ``unread_if`` maps a read argument to a predicate on the
    bound arguments under which its old contents are ignored; ``finite``
    whether ``check_finite`` applies.  Elementwise rows (``kernel`` set) also
    have ``numpy``, a function ``(handler, *args)`` computing the op in
    place, ``doc`` and ``check``, an extra rule on the checked scalars.
    """

    __slots__ = ("check", "disjoint", "doc", "finite", "kernel", "kind", "name", "numpy",
                 "out", "params", "reads", "scalars", "unread_if", "unused", "writes")

    def __init__(self, name, params="", kind="op", disjoint=(), unread_if=None, finite=True,
                 kernel=None, numpy=None, doc="", check=None):
        self.name, self.kind = name, kind
        self.params, reads, writes, unused, scalars = [], [], [], [], []
        for token in params.split():
            if token.startswith("#"):
                scalars.append(token[1:])
                self.params.append(token[1:])
                continue
            arg = token.rstrip("=+~")
            self.params.append(arg)
            if token.endswith("+="):
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
        self.scalars = tuple(scalars)
        self.disjoint, self.unread_if, self.finite = tuple(disjoint), unread_if or {}, finite
        self.kernel, self.numpy, self.doc, self.check = kernel, numpy, doc, check
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


def _quiet(fn):
    """Wrap a NumPy expression so that it warns about nothing: NaN, inf and
    division by zero are results here, as on the GPU."""
    def run(h, *args):
        with np.errstate(all="ignore"):
            fn(h, *args)
    return run


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


def _clip_rule(a_min, a_max):
    if a_min > a_max:
        fail_value("clip_t", f"a_min {a_min} is greater than a_max {a_max}")


def ew(name, params, kernel, numpy, doc, check=None, quiet=False):
    """A row of the elementwise family: same-shape arrays, one kernel."""
    return Op(name, params, kernel=kernel, numpy=_quiet(numpy) if quiet else numpy, doc=doc,
              check=check)


def _op(name, params, **kw):
    return Op(name, params, **kw)


_S = "stream"

#: op name -> Op, for every public op of ``Handler``.
OPS = {op.name: op for op in [
    # ---------------------------------------------------------------- streams and life
    *(Op(n, kind=_S) for n in ("with_streams", "record_event", "wait_event", "wait_for",
                               "synchronize", "synchronize_all_streams", "capture", "close",
                               "pin", "prefetch", "empty_pinned")),
    # ---------------------------------------------------------------- memory
    Op("allocate", kind="alloc", finite=False),   # undefined contents: may hold NaN
    Op("zeros", kind="alloc", finite=False),      # finite by construction
    Op("ones", kind="alloc", finite=False),
    Op("create_from_numpy", kind="alloc"),
    Op("create_from_device_array", kind="alloc", finite=False),   # another library's memory
    Op("get_numpy_copy", "a", kind="host_read", finite=False),
    _op("get_numpy_copy_async", "a", finite=False),   # a read on this group; out is host
    _op("set_from_numpy", "a="),
    _op("copy_to", "src dest="),
    _op("fill", "a= #value"),
    # ---------------------------------------------------------------- BLAS and reductions
    _op("dot_mm", "a b out=", disjoint=("a", "b")),
    _op("dot_add_mm", "a b out+=", disjoint=("a", "b")),
    _op("axpby", "#alpha x #beta y+=", unread_if={"y": lambda args: _is_zero(args.get("beta"))},
        kernel="axpby"),
    _op("sum_t", "a out=", disjoint=("a",)),
    # ---------------------------------------------------------------- elementwise
    ew("add_tt", "a b out=", "binary_add", lambda h, a, b, out: np.add(a, b, out=out),
       "out = a + b."),
    ew("subtract_tt", "a b out=", "binary_sub",
       lambda h, a, b, out: np.subtract(a, b, out=out), "out = a - b."),
    ew("mult_tt", "a b out=", "binary_mul", lambda h, a, b, out: np.multiply(a, b, out=out),
       "out = a * b."),
    ew("divide_tt", "a b out=", "binary_div", lambda h, a, b, out: np.divide(a, b, out=out),
       "out = a / b (IEEE division: x / 0 is inf or NaN).", quiet=True),
    ew("mult_add_tt", "a b out+=", "binary_mul_add",
       lambda h, a, b, out: _add_product(h, np.multiply, a, b, out), "out += a * b."),
    ew("maximum_tt", "a b out=", "binary_max", _nan_aware(np.maximum),
       "out = max(a, b), elementwise; NaN if either is NaN."),
    ew("minimum_tt", "a b out=", "binary_min", _nan_aware(np.minimum),
       "out = min(a, b), elementwise; NaN if either is NaN."),
    ew("greater_tt", "a b out=", "binary_greater",
       lambda h, a, b, out: np.greater(a, b, out=out),
       "out = 1 where a > b, else 0 (0 where either is NaN).", quiet=True),
    ew("add_st", "#s t out=", "scalar_add", lambda h, s, t, out: np.add(t, s, out=out),
       "out = t + s for a scalar s."),
    ew("mult_st", "#s t out=", "scalar_mul", lambda h, s, t, out: np.multiply(t, s, out=out),
       "out = s * t for a scalar s."),
    ew("mult_add_st", "#s t out+=", "scalar_mul_add",
       lambda h, s, t, out: _add_product(h, np.multiply, t, s, out), "out += s * t."),
    ew("pow_st", "#s t out=", "scalar_pow", lambda h, s, t, out: np.power(t, s, out=out),
       "out = t ** s for a scalar exponent s; NaN where t < 0 and s is not an integer.",
       quiet=True),
    ew("where_t", "cond a b out=", "where",
       _where, "out = a where cond != 0, else b (NaN in cond counts as true)."),
    ew("abs_t", "a out=", "unary_abs", lambda h, a, out: np.abs(a, out=out),
       "out = abs(a), elementwise."),
    ew("sign_t", "a out=", "unary_sign", lambda h, a, out: np.sign(a, out=out),
       "out = sign(a): -1, 0 or 1 (0 for NaN is not guaranteed)."),
    ew("square_t", "a out=", "unary_square", lambda h, a, out: np.multiply(a, a, out=out),
       "out = a * a."),
    ew("sqrt_t", "a out=", "unary_sqrt", lambda h, a, out: np.sqrt(a, out=out),
       "out = sqrt(a); NaN where a < 0.", quiet=True),
    ew("rsqrt_t", "a out=", "unary_rsqrt", _rsqrt,
       "out = 1 / sqrt(a); inf at 0, NaN where a < 0.", quiet=True),
    ew("log_t", "a out=", "unary_log", lambda h, a, out: np.log(a, out=out),
       "out = natural log of a; -inf at 0, NaN where a < 0.", quiet=True),
    ew("exp_t", "a out=", "unary_exp", lambda h, a, out: np.exp(a, out=out),
       "out = exp(a).", quiet=True),
    ew("clip_t", "a #a_min #a_max out=", "clip",
       lambda h, a, a_min, a_max, out: np.clip(a, a_min, a_max, out=out),
       "out = min(max(a, a_min), a_max); requires a_min <= a_max.", check=_clip_rule),
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
    _op("broadcast_t", "a out="),
    _op("add_mv", "m v out="),
    _op("subtract_mv", "m v out="),
    _op("mult_mv", "m v out="),
    _op("divide_mv", "m v out="),
    _op("softmax_m", "m out="),
    _op("index_m_by_v", "m v out=", disjoint=("m",)),   # out may be v
    _op("binarize_v", "v out=", disjoint=("v",)),
    # Runs on the caller's group and blocks the host; a read on the group.
    _op("is_fully_finite", "a", finite=False),
    _op("fill_gaussian", "#mean #std out="),
    _op("generate_probability_mask", "mask= #p"),
]}

#: The elementwise rows: same-shape arrays, methods made by :func:`install`.
ELEMENTWISE = {name: op for name, op in OPS.items() if op.numpy is not None}


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
    **{f"mv_{o}_{side}": ("elementwise", "PPPqq") for o in ("add", "sub", "mul", "div")
       for side in ("row", "col")},
    "broadcast": ("elementwise", "PPqqq"),
    "all_finite": ("elementwise", "PqP"),
    "softmax_rows": ("rows", "PPqq"),
    "index_m_by_v": ("rows", "PPPqq"),
    "binarize_v": ("rows", "PPqq"),
    "fill_gaussian": ("random", "PqTTQQP"),
    "probability_mask": ("random", "PqTQQP"),
    "rng_advance": ("random", "PQ"),
    "sum_rows": ("reduce", "PPPPqqqq"),
    "sum_cols": ("reduce", "PPPPqqqqqi"),
    "sum_cols_vec": ("reduce", "PPPPqqqqqi"),
    "small_gemm": ("small_gemm", "PPPqqqiii"),
}


_TEMPLATE = '''\
def {name}(self, {sig}):
    {scalars}check_same_shape(self, "{name}", {arrays}){extra}
    self._elementwise(OP, {sig})
'''


def _method(op):
    """Build the public method of an elementwise row (by source, so that it
    has the row's real signature and no per-call overhead)."""
    lines = "".join(f'{s} = check_scalar("{op.name}", "{s}", {s})\n    ' for s in op.scalars)
    extra = f"\n    OP.check({', '.join(op.scalars)})" if op.check else ""
    src = _TEMPLATE.format(name=op.name, sig=", ".join(op.params), scalars=lines,
                           arrays=", ".join(p for p in op.params if p not in op.scalars),
                           extra=extra)
    from .checks import check_same_shape
    namespace = {"OP": op, "check_scalar": check_scalar, "check_same_shape": check_same_shape}
    exec(compile(src, f"<optable {op.name}>", "exec"), namespace)
    fn = namespace[op.name]
    same = "all arrays of one shape"
    fn.__doc__ = f"{op.doc}\n\nShapes: {same}. Aliasing: {op.aliasing()}"
    return fn


def install(cls):
    """Class decorator: give ``cls`` (the contract) a method per elementwise row."""
    for name, op in ELEMENTWISE.items():
        if name in vars(cls):
            raise TypeError(f"{cls.__name__}.{name} is written by hand and in the op table")
        fn = _method(op)
        fn.__qualname__ = f"{cls.__name__}.{name}"
        fn.__module__ = cls.__module__
        setattr(cls, name, fn)
    return cls
