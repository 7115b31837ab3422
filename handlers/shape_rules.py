"""The shape rules of the ops that are not elementwise.

Each rule is named by a row of the op table (``handlers.optable``, its
``shape`` field) and runs inside the public method the table makes for that
row, after the arrays' type, dtype and contiguity have been checked and
before any overlap check.  A rule raises ``ValueError`` (through
``checks.fail_value``) naming the op and the shapes, or returns the value the
row binds for its backend call (the normalised axis, the broadcast side),
or None.  Rules take the handler first, then the op's arguments in signature
order, minus its scalars (device scalars, ``$`` tokens, are passed: a float
or a one-element array).
"""
import math

import numpy as np

from . import dtypes
from .activations import DOT_ACTS
from .checks import check_ndim, check_same_shape, fail_type, fail_value, normalize_axis

_UNSEEN = object()   # sum_t: a shape combination not validated yet


def dot(op):
    """``dot_mm``/``dot_add_mm``: op(a) (m, k) @ op(b) (k, n) -> out (m, n), or
    a batch of them: out (B, m, n) with a and b each (B, ., .) or 2-D (one
    matrix shared by the whole batch), not both 2-D.  The flags transpose the
    last two axes."""
    def rule(h, a, b, out, transa, transb):
        if len(a.shape) != 2 or len(b.shape) != 2 or len(out.shape) != 2:
            return _batched_dot(op, a, b, out, transa, transb)
        m, k = (a.shape[1], a.shape[0]) if transa else a.shape
        k2, n = (b.shape[1], b.shape[0]) if transb else b.shape
        if k != k2 or out.shape != (m, n):
            fail_value(op, f"shapes do not match: a {a.shape}{'.T' if transa else ''}, "
                           f"b {b.shape}{'.T' if transb else ''}, out {out.shape}")
    return rule


def _check_act(op, act):
    """ValueError unless ``act`` is one of ``handlers.activations.DOT_ACTS``
    (the activations of the ops with a bias and an activation)."""
    if act not in DOT_ACTS:
        fail_value(op, f"act must be one of {DOT_ACTS}, got {act!r}")


def dot_bias_act(h, a, b, bias, out, act):
    """``dot_bias_act``: a (m, k) @ b (k, n) + bias (1, n) -> out (m, n), act
    one of ``handlers.activations.DOT_ACTS``."""
    _check_act("dot_bias_act", act)
    for x, name in ((a, "a"), (b, "b"), (bias, "bias"), (out, "out")):
        check_ndim("dot_bias_act", x, 2, name)
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or out.shape != (m, n) or bias.shape != (1, n):
        fail_value("dot_bias_act", f"shapes do not match: a {a.shape}, b {b.shape}, "
                                   f"bias {bias.shape} (must be (1, n)), out {out.shape}")


def _batched_dot(op, a, b, out, transa, transb):
    """The 3-D form of ``dot``; out is (B, m, n)."""
    if len(out.shape) != 3:
        fail_value(op, f"out must be 2-D (m, n), or 3-D (batch, m, n) with a 3-D a or b: "
                       f"a {a.shape}, b {b.shape}, out {out.shape}")
    for x, name in ((a, "a"), (b, "b")):
        if len(x.shape) not in (2, 3):
            fail_value(op, f"{name} must be 2-D or 3-D (batch first) for a 3-D out, "
                           f"got shape {x.shape}")
    if len(a.shape) == 2 and len(b.shape) == 2:
        fail_value(op, f"a 3-D out {out.shape} needs a 3-D a or b (a {a.shape}, b {b.shape})")
    batch = out.shape[0]
    for x, name in ((a, "a"), (b, "b")):
        if len(x.shape) == 3 and x.shape[0] != batch:
            fail_value(op, f"batch sizes differ: {name} {x.shape}, out {out.shape}")
    ra, ca = a.shape[-2:]
    rb, cb = b.shape[-2:]
    m, k = (ca, ra) if transa else (ra, ca)
    k2, n = (cb, rb) if transb else (rb, cb)
    if k != k2 or out.shape[1:] != (m, n):
        ta, tb = (" (last two axes .T)" if t else "" for t in (transa, transb))
        fail_value(op, f"shapes do not match: a {a.shape}{ta}, b {b.shape}{tb}, "
                       f"out {out.shape}")


def reduction(op):
    """``sum_t`` and ``mean_t``: returns the axes to reduce, None (all), an
    int in ``range(a.ndim)``, or a sorted tuple of two or more such ints."""
    def rule(h, a, axis, out):
        # The shape checks cost more than the launch's Python; a combination
        # that passed them once needs only a lookup.
        key = (a.shape, axis, out.shape)
        plain = plain_axis(axis)
        checked = h._sum_shapes.get(key, _UNSEEN) if plain else _UNSEEN
        if checked is _UNSEEN:
            checked = _sum_shapes(a, axis, out, op)
            if plain:
                h._sum_shapes[key] = checked
        return checked
    return rule


def plain_axis(axis):
    """True for an axis that may key a cache of checked combinations: None,
    an int or a tuple of ints, none of them a bool (True would hash and
    compare like 1, so a cached check of axis 1 would pass it)."""
    if type(axis) is tuple:
        return all(type(x) is int for x in axis)
    return type(axis) is int or axis is None


def _axes(op, axis, nd):
    """A tuple ``axis`` as a sorted tuple of distinct axes in ``range(nd)``."""
    if not axis:
        fail_value(op, "axis must not be an empty tuple")
    axes = sorted(normalize_axis(op, x, nd) for x in axis)
    if len(set(axes)) != len(axes):
        fail_value(op, f"axis {axis} names an axis twice")
    return tuple(axes)


def _sum_shapes(a, axis, out, op="sum_t"):
    nd = len(a.shape)
    if nd == 0:
        fail_value(op, "a must have rank >= 1, got shape ()")
    if axis is None:
        if out.size != 1 or len(out.shape) not in (0, 1, nd):
            fail_value(op, f"out shape {out.shape} does not fit a full sum of {a.shape}")
        return None
    if isinstance(axis, tuple):
        axes = _axes(op, axis, nd)
    elif isinstance(axis, (list, np.ndarray)):
        fail_type(op, f"axis must be an int, None or a tuple of ints, got {axis!r}")
    else:
        axes = (normalize_axis(op, axis, nd),)
    s = a.shape
    dropped = tuple(d for i, d in enumerate(s) if i not in axes)
    kept = tuple(1 if i in axes else d for i, d in enumerate(s))
    if out.shape != dropped and out.shape != kept:
        fail_value(op, f"out shape {out.shape} does not fit the reduction of "
                       f"{a.shape} over axis {axis}")
    return axes[0] if len(axes) == 1 else axes


def checked_axis(a, axis, out, op):
    """The axis of a reduction call that has passed its checks, as its rule
    returns it (None, an int in range or a sorted tuple): pure, no handler."""
    return _sum_shapes(a, axis, out, op)


def reduced_size(shape, axis):
    """The number of elements each result of a reduction of ``shape`` over
    a checked ``axis`` (None, an int or a tuple of ints) adds up."""
    axes = range(len(shape)) if axis is None else axis if type(axis) is tuple else (axis,)
    return math.prod(shape[i] for i in axes)


def _exact_indices(h, op, n, what):
    """Indices 0..n-1 are stored as floats of ``h.dtype``: raise unless all
    are exact there (up to 2^24 in float32, 2048 in float16, 256 in bfloat16)."""
    limit = dtypes.exact_integers(h.dtype)
    if n - 1 > limit:
        fail_value(op, f"{what} has {n} elements, too many for {h.dtype} indices (whole "
                       f"numbers are exact in {h.dtype} up to {limit})")


def extreme(op):
    """``max_t``, ``min_t``, ``argmax_t``: one axis (an int), of length >= 1;
    returns it in ``range(a.ndim)``."""
    def rule(h, a, axis, out):
        if isinstance(axis, tuple) or axis is None:
            fail_type(op, f"axis must be an int, got {axis!r}")
        axis = _sum_shapes(a, axis, out, op)   # rank, axis and out shape, as sum_t's
        if a.shape[axis] == 0:
            fail_value(op, f"axis {axis} of {a.shape} is empty: no extreme to take")
        if op == "argmax_t":
            _exact_indices(h, op, a.shape[axis], f"axis {axis} of {a.shape}")
        return axis
    return rule


def broadcast_t(h, a, axis, out):
    """``broadcast_t``: ``a`` is ``out``'s shape with a 1 at ``axis``; returns the axis."""
    nd = len(out.shape)
    if nd == 0:
        fail_value("broadcast_t", "out must have rank >= 1")
    axis = normalize_axis("broadcast_t", axis, nd)
    want = out.shape[:axis] + (1,) + out.shape[axis + 1:]
    if a.shape != want:
        fail_value("broadcast_t", f"a shape {a.shape} cannot be broadcast along axis "
                                  f"{axis} to {out.shape} (expected {want})")
    return axis


def mv(op):
    """The ``*_mv`` ops: returns 0 for a row vector (1, n), 1 for a column (m, 1)."""
    def rule(h, m, v, out):
        check_ndim(op, m, 2, "m")
        check_ndim(op, v, 2, "v")
        if out.shape != m.shape:
            fail_value(op, f"out shape {out.shape} differs from m shape {m.shape}")
        rows, cols = m.shape
        if v.shape == (1, cols):
            return 0
        if v.shape == (rows, 1):
            return 1
        fail_value(op, f"v shape {v.shape} must be (1, {cols}) or ({rows}, 1) for m {m.shape}")
    return rule


def softmax_m(h, m, out):
    """``softmax_m``: one 2-D shape, with at least one column (rows may be 0)."""
    check_same_shape(h, "softmax_m", m, out)
    check_ndim("softmax_m", m, 2, "m")
    if m.shape[1] == 0:
        fail_value("softmax_m", f"m has 0 columns: the softmax of an empty row is undefined, "
                                f"got m {m.shape}")


def index_m_by_v(h, m, v, out):
    """``index_m_by_v``: m (r, c), v and out (r, 1)."""
    check_ndim("index_m_by_v", m, 2, "m")
    rows = m.shape[0]
    if v.shape != (rows, 1) or out.shape != (rows, 1):
        fail_value("index_m_by_v", f"for m {m.shape}, v and out must be ({rows}, 1); "
                                   f"got v {v.shape}, out {out.shape}")
    _exact_indices(h, "index_m_by_v", m.shape[1], f"m {m.shape} (its columns)")


def binarize_v(h, v, out):
    """``binarize_v``: out (r, c), v (r, 1)."""
    check_ndim("binarize_v", out, 2, "out")
    if v.shape != (out.shape[0], 1):
        fail_value("binarize_v", f"v shape {v.shape} must be ({out.shape[0]}, 1) "
                                 f"for out {out.shape}")
    _exact_indices(h, "binarize_v", out.shape[1], f"out {out.shape} (its columns)")


def rows_by_index(op, rows):
    """``gather_rows_m``/``scatter_add_rows_m``: a table (vocab, d), the
    ``rows`` array (n, d) and idx (n,) or (n, 1).  The table is ``out`` of
    the scatter and the first argument of the gather; ``rows`` names the other."""
    def rule(h, first, idx, out):
        table, picked = (first, out) if rows == "out" else (out, first)
        tname = "table" if rows == "out" else "out"
        check_ndim(op, table, 2, tname)
        check_ndim(op, picked, 2, rows)
        n, d = picked.shape
        if table.shape[1] != d:
            fail_value(op, f"{rows} shape {picked.shape} and {tname} shape {table.shape} "
                           f"differ in their number of columns")
        if idx.shape != (n,) and idx.shape != (n, 1):
            fail_value(op, f"idx shape {idx.shape} must be ({n},) or ({n}, 1) for "
                           f"{rows} {picked.shape}")
        _exact_indices(h, op, table.shape[0], f"{tname} {table.shape} (its rows)")
    return rule


def normalize_rows_m(h, x, xhat, rstd):
    """``normalize_rows_m``: x and xhat (n, d) with d >= 1, rstd (n, 1)."""
    op = "normalize_rows_m"
    check_ndim(op, x, 2, "x")
    n, d = x.shape
    if d < 1:
        fail_value(op, f"x shape {x.shape}: rows must not be empty")
    if xhat.shape != x.shape or rstd.shape != (n, 1):
        fail_value(op, f"for x {x.shape}, xhat must be {x.shape} and rstd ({n}, 1); "
                       f"got xhat {xhat.shape}, rstd {rstd.shape}")


def normalize_rows_backward_m(h, xhat, rstd, g, dx):
    """``normalize_rows_backward_m``: xhat, g and dx (n, d) with d >= 1, rstd (n, 1)."""
    op = "normalize_rows_backward_m"
    check_ndim(op, xhat, 2, "xhat")
    n, d = xhat.shape
    if d < 1:
        fail_value(op, f"xhat shape {xhat.shape}: rows must not be empty")
    if g.shape != xhat.shape or dx.shape != xhat.shape or rstd.shape != (n, 1):
        fail_value(op, f"for xhat {xhat.shape}, g and dx must be {xhat.shape} and rstd "
                       f"({n}, 1); got g {g.shape}, dx {dx.shape}, rstd {rstd.shape}")


def transpose_m(h, a, out):
    """``transpose_m``: a (r, c), out (c, r)."""
    check_ndim("transpose_m", a, 2, "a")
    if out.shape != (a.shape[1], a.shape[0]):
        fail_value("transpose_m", f"out shape {out.shape} must be {(a.shape[1], a.shape[0])} "
                                  f"for a {a.shape}")


def _pieces(op, whole, first, second, axis, names):
    """``first`` and ``second`` are ``whole`` cut in two along ``axis``;
    returns the axis in ``range(whole.ndim)``."""
    nd = len(whole.shape)
    shapes = (f"{names[0]} {whole.shape}, {names[1]} {first.shape}, "
              f"{names[2]} {second.shape}")
    if nd == 0 or len(first.shape) != nd or len(second.shape) != nd:
        fail_value(op, f"arrays must have one rank >= 1: {shapes}")
    axis = normalize_axis(op, axis, nd)
    if any(first.shape[i] != whole.shape[i] or second.shape[i] != whole.shape[i]
           for i in range(nd) if i != axis) \
            or first.shape[axis] + second.shape[axis] != whole.shape[axis]:
        fail_value(op, f"{names[1]} and {names[2]} do not make {names[0]} along axis "
                       f"{axis}: {shapes}")
    return axis


def concat_t(h, a, b, axis, out):
    """``concat_t``: out is a then b along ``axis``; returns the axis."""
    return _pieces("concat_t", out, a, b, axis, ("out", "a", "b"))


#: The most axes ``permute_t`` takes (its kernel's index arithmetic).
PERMUTE_RANK = 4


def permute_t(h, a, axes, out):
    """``permute_t``: ``axes`` a permutation of range(a.ndim) (a tuple or
    list of ints), a.ndim from 1 to :data:`PERMUTE_RANK`, out a's shape
    permuted; returns the axes as a tuple."""
    op = "permute_t"
    if not 1 <= a.ndim <= PERMUTE_RANK:
        fail_value(op, f"a must have 1 to {PERMUTE_RANK} dimensions, got shape {a.shape}")
    if not isinstance(axes, (tuple, list)) or not all(_is_int(x) for x in axes):
        fail_type(op, f"axes must be a tuple of ints, got {axes!r}")
    axes = tuple(int(x) for x in axes)
    if sorted(axes) != list(range(a.ndim)):
        fail_value(op, f"axes must order every axis of a (shape {a.shape}) once, got {axes}")
    want = tuple(a.shape[i] for i in axes)
    if out.shape != want:
        fail_value(op, f"out must have shape {want} for a {a.shape} and axes {axes}, "
                       f"got {out.shape}")
    return axes


def split_t(h, a, axis, out_a, out_b):
    """``split_t``: a is out_a then out_b along ``axis``; returns the axis."""
    return _pieces("split_t", a, out_a, out_b, axis, ("a", "out_a", "out_b"))


# ---------------------------------------------------------------- convolution and pooling
def _is_int(v):
    """An int or NumPy integer, not a bool (``type(True) is bool``)."""
    return type(v) is int or isinstance(v, np.integer)


def _pair(op, name, value, low):
    """A conv/pool parameter as a pair of ints >= ``low``: an int (both
    axes) or a pair (height, width).  TypeError for anything else.  (Runs on
    every convolution call: written without generators or formatting on the
    good path.)"""
    if type(value) is int and value >= low:   # the common case, accepted at once
        return (value, value)
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or not (_is_int(pair[0]) and _is_int(pair[1])):
        fail_type(op, f"{name} must be an int or a pair of ints, got {value!r}")
    pair = (int(pair[0]), int(pair[1]))
    if pair[0] < low or pair[1] < low:
        what = "positive" if low == 1 else "non-negative"
        fail_value(op, f"{name} must be {what}, got {value!r}")
    return pair


def _conv_params(op, stride, padding, dilation):
    return (_pair(op, "stride", stride, 1), _pair(op, "padding", padding, 0),
            _pair(op, "dilation", dilation, 1))


def conv_out_size(size, window, stride, pad, dil):
    """Output length of a convolution or pooling along one axis:
    ``(size + 2*pad - dil*(window-1) - 1) // stride + 1`` (may be < 1)."""
    return (size + 2 * pad - dil * (window - 1) - 1) // stride + 1


def _nchw(op, name, a):
    check_ndim(op, a, 4, name)
    return a.shape


def _conv_geometry(op, x_shape, w_shape, y_shape, params, names):
    """Check x (N,C,H,W), w (K,C,R,S) and y (N,K,P,Q) against each other;
    ``names`` are the arguments holding them (for the messages)."""
    (sh, sw), (ph, pw), (dh, dw) = params
    n, c, h, wd = x_shape
    k, c2, r, s = w_shape

    def shapes():   # for the messages: formatted only on failure
        return f"{names[0]} {x_shape}, {names[1]} {w_shape}, {names[2]} {y_shape}"
    if c2 != c:
        fail_value(op, f"channels differ: {names[0]} has {c}, {names[1]} has {c2} ({shapes()})")
    p, q = conv_out_size(h, r, sh, ph, dh), conv_out_size(wd, s, sw, pw, dw)
    if p < 1 or q < 1 or min(n, c, k, h, wd, r, s) < 1:
        # Something empty first: each named, rather than "the kernel does not fit".
        for size, what in ((n, f"the batch is empty: N = 0 samples in {names[0]}"),
                           (c, f"there are 0 channels (C) in {names[0]} and {names[1]}"),
                           (k, f"there are 0 filters (K) in {names[1]}, so 0 channels in "
                               f"{names[2]}"),
                           (min(h, wd), f"the image of {names[0]} is empty (H or W is 0)"),
                           (min(r, s), f"the kernel of {names[1]} is empty (R or S is 0)")):
            if size < 1:
                fail_value(op, f"{what}; every size must be >= 1, got {shapes()}")
        fail_value(op, f"no output: the dilated {r}x{s} kernel (dilation {(dh, dw)}) does "
                       f"not fit the padded input ({shapes()}, padding {(ph, pw)})")
    if y_shape != (n, k, p, q):
        fail_value(op, f"{names[2]} must have shape {(n, k, p, q)}: {shapes()}, stride "
                       f"{(sh, sw)}, padding {(ph, pw)}, dilation {(dh, dw)}")


def conv2d(op):
    """The three conv2d ops, NCHW: returns (stride, padding, dilation) as
    pairs.  The arrays are (x, w, out), (dy, w, dx) or (x, dy, dw)."""
    def rule(h, a, b, out, stride, padding, dilation):
        params = _conv_params(op, stride, padding, dilation)
        if op in ("conv2d_forward", "conv2d_bias_act"):
            _conv_geometry(op, _nchw(op, "x", a), _nchw(op, "w", b), _nchw(op, "out", out),
                           params, ("x", "w", "out"))
        elif op == "conv2d_backward_data":
            _conv_geometry(op, _nchw(op, "dx", out), _nchw(op, "w", b), _nchw(op, "dy", a),
                           params, ("dx", "w", "dy"))
        else:
            _conv_geometry(op, _nchw(op, "x", a), _nchw(op, "dw", out), _nchw(op, "dy", b),
                           params, ("x", "dw", "dy"))
        return params
    return rule


def conv2d_bias_act(h, x, w, bias, out, stride, padding, dilation, act):
    """``conv2d_bias_act``: conv2d_forward's rule, bias (K,) and ``act`` one
    of ``handlers.activations.DOT_ACTS``; returns the pairs as it does."""
    op = "conv2d_bias_act"
    _check_act(op, act)
    params = conv2d(op)(h, x, w, out, stride, padding, dilation)
    check_ndim(op, bias, 1, "bias")
    if bias.shape != (w.shape[0],):
        fail_value(op, f"bias must have shape {(w.shape[0],)} (one value per output "
                       f"channel of w {w.shape}), got {bias.shape}")
    return params


def pool2d(op):
    """The pooling ops, NCHW: returns (window, stride, padding) as pairs.
    The arrays are (x, out[, argmax]) forward and ([argmax,] dy, dx)
    backward; ``stride`` None means the window.  Padding must be smaller
    than the window, so that every window holds at least one input."""
    backward = op.endswith("backward")

    def rule(h, *args):
        *arrays, window, stride, padding = args
        window = _pair(op, "window", window, 1)
        stride = window if stride is None else _pair(op, "stride", stride, 1)
        padding = _pair(op, "padding", padding, 0)
        if padding[0] >= window[0] or padding[1] >= window[1]:
            fail_value(op, f"padding {padding} must be smaller than the window {window}")
        if backward:   # dx, last, is the input-sized array
            names = ("argmax", "dy", "dx") if len(arrays) == 3 else ("dy", "dx")
            at = len(arrays) - 1
        else:          # x, first
            names = ("x", "out", "argmax") if len(arrays) == 3 else ("x", "out")
            at = 0
        big, big_name = arrays[at], names[at]
        for name, a in zip(names, arrays):
            _nchw(op, name, a)
        n, c, hh, ww = big.shape
        p = conv_out_size(hh, window[0], stride[0], padding[0], 1)
        q = conv_out_size(ww, window[1], stride[1], padding[1], 1)
        shapes = ", ".join(f"{nm} {a.shape}" for nm, a in zip(names, arrays))
        if p < 1 or q < 1 or min(n, c) < 1:
            if n < 1:
                fail_value(op, f"the batch is empty: N = 0 samples; N and C must be >= 1, "
                               f"got {shapes}")
            if c < 1:
                fail_value(op, f"there are 0 channels (C); N and C must be >= 1, got {shapes}")
            fail_value(op, f"no output: window {window} does not fit {big_name} {big.shape} "
                           f"with padding {padding}")
        if op.startswith("max"):
            _exact_indices(h, op, window[0] * window[1], f"a window of {window[0]}x{window[1]}")
        want = (n, c, p, q)
        for i, (name, a) in enumerate(zip(names, arrays)):
            if i != at and a.shape != want:
                fail_value(op, f"{name} must have shape {want} ({shapes}, window {window}, "
                               f"stride {stride}, padding {padding})")
        return window, stride, padding
    return rule


def adam_update(h, g, lr, step, m, v, p, decoupled, gate):
    """``adam_update``: g, m, v and p of one shape, step one element; a
    device-scalar lr or gate must not overlap an output (the op's other
    overlap rules come from its row)."""
    check_same_shape(h, "adam_update", g, m, v, p)
    if step.size != 1:
        fail_value("adam_update", f"step must have one element, got shape {step.shape}")
    for scalar, sname in ((lr, "lr"), (gate, "gate")):
        if type(scalar) is not float:
            for out, name in ((m, "m"), (v, "v"), (p, "p")):   # step: checked with the scalar
                if h._overlaps(scalar, out):
                    fail_value("adam_update", f"{sname} must not overlap {name}")


def scale_finite_t(h, a, factor, flag):
    """``scale_finite_t``: flag one element; a device-scalar factor apart
    from flag (from a: checked with the scalar; flag from a: by the row)."""
    if flag.size != 1:
        fail_value("scale_finite_t", f"flag must have one element, got shape {flag.shape}")
    if type(factor) is not float and h._overlaps(factor, flag):
        fail_value("scale_finite_t", "factor must not overlap flag")


def update_loss_scale(h, flag, state):
    """``update_loss_scale``: flag one element, state four, apart."""
    if flag.size != 1:
        fail_value("update_loss_scale", f"flag must have one element, got shape {flag.shape}")
    if state.shape != (4,):
        fail_value("update_loss_scale", f"state must have shape (4,), got {state.shape}")
    if h._overlaps(flag, state):
        fail_value("update_loss_scale", "flag must not overlap state")


# ---------------------------------------------------------------- formats
def cast_t(h, src, dst):
    """``cast_t``: src and dst have one shape (their formats may differ)."""
    if src.shape != dst.shape:
        fail_value("cast_t", f"shapes differ: src {src.shape}, dst {dst.shape}")


def _attention_scale(op, q, scale):
    """The checked scale: None means 1 / sqrt(head size)."""
    if scale is None:
        return 1.0 / math.sqrt(q.shape[3])
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)) \
            or not math.isfinite(scale) or scale <= 0:
        fail_value(op, f"scale must be None or a finite number > 0, got {scale!r}")
    return float(scale)


def _attention_shapes(op, q, k, v, out, lse):
    """q and out (B, H, T, D), k and v (B, H, S, D), lse (B, H, T), none empty."""
    for name, a in (("q", q), ("k", k), ("v", v), ("out", out)):
        check_ndim(op, a, 4, name)
    check_ndim(op, lse, 3, "lse")
    b, h, t, d = q.shape
    s = k.shape[2]
    if 0 in q.shape or s == 0:
        fail_value(op, f"q {q.shape} and k {k.shape} must not be empty")
    if k.shape != (b, h, s, d) or v.shape != k.shape:
        fail_value(op, f"k and v must be (B, H, S, D) = {(b, h, 'S', d)} for q {q.shape}, "
                       f"got k {k.shape}, v {v.shape}")
    if out.shape != q.shape or lse.shape != (b, h, t):
        fail_value(op, f"for q {q.shape}, out must be {q.shape} and lse {(b, h, t)}; got "
                       f"out {out.shape}, lse {lse.shape}")


def attention_forward(h, q, k, v, out, lse, causal, scale):
    """``attention_forward``: q and out (B, H, T, D), k and v (B, H, S, D),
    lse (B, H, T), none empty; returns the scale (None: 1 / sqrt(D))."""
    op = "attention_forward"
    _attention_shapes(op, q, k, v, out, lse)
    return _attention_scale(op, q, scale)


def attention_backward(h, q, k, v, out, lse, dout, dq, dk, dv, causal, scale):
    """``attention_backward``: the forward's shapes, dout and dq as q, dk
    and dv as k; returns the scale as the forward's rule does."""
    op = "attention_backward"
    _attention_shapes(op, q, k, v, out, lse)
    for name, a, like in (("dout", dout, q), ("dq", dq, q), ("dk", dk, k), ("dv", dv, k)):
        if a.shape != like.shape:
            fail_value(op, f"{name} must have shape {like.shape}, got {a.shape}")
    return _attention_scale(op, q, scale)
