"""The shape rules of the ops that are not elementwise.

Each rule is named by a row of the op table (``handlers.optable``, its
``shape`` field) and runs inside the public method the table makes for that
row, after the arrays' type, dtype and contiguity have been checked and
before any overlap check.  A rule raises ``ValueError`` (through
``checks.fail_value``) naming the op and the shapes, or returns the value the
row binds for its backend call (the normalised axis, the broadcast side),
or None.  Rules take the handler first, then the op's arguments in signature
order, minus its scalars.
"""
import numpy as np

from .checks import check_ndim, check_same_shape, fail_type, fail_value, normalize_axis

_UNSEEN = object()   # sum_t: a shape combination not validated yet


def dot(op):
    """``dot_mm``/``dot_add_mm``: 2-D arrays, op(a) (m, k) @ op(b) (k, n) -> out (m, n)."""
    def rule(h, a, b, out, transa, transb):
        if len(a.shape) != 2 or len(b.shape) != 2 or len(out.shape) != 2:
            for x, name in ((a, "a"), (b, "b"), (out, "out")):
                check_ndim(op, x, 2, name)
        m, k = (a.shape[1], a.shape[0]) if transa else a.shape
        k2, n = (b.shape[1], b.shape[0]) if transb else b.shape
        if k != k2 or out.shape != (m, n):
            fail_value(op, f"shapes do not match: a {a.shape}{'.T' if transa else ''}, "
                           f"b {b.shape}{'.T' if transb else ''}, out {out.shape}")
    return rule


def reduction(op):
    """``sum_t`` and ``mean_t``: returns the axes to reduce, None (all), an
    int in ``range(a.ndim)``, or a sorted tuple of two or more such ints."""
    def rule(h, a, axis, out):
        # The shape checks cost more than the launch's Python; a combination
        # that passed them once needs only a lookup (plain ints and None only:
        # True would hash like 1).
        key = (a.shape, axis, out.shape)
        plain = type(axis) is int or axis is None
        checked = h._sum_shapes.get(key, _UNSEEN) if plain else _UNSEEN
        if checked is _UNSEEN:
            checked = _sum_shapes(a, axis, out, op)
            if plain:
                h._sum_shapes[key] = checked
        return checked
    return rule


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


def extreme(op):
    """``max_t``, ``min_t``, ``argmax_t``: one axis (an int), of length >= 1;
    returns it in ``range(a.ndim)``."""
    def rule(h, a, axis, out):
        if isinstance(axis, tuple) or axis is None:
            fail_type(op, f"axis must be an int, got {axis!r}")
        axis = _sum_shapes(a, axis, out, op)   # rank, axis and out shape, as sum_t's
        if a.shape[axis] == 0:
            fail_value(op, f"axis {axis} of {a.shape} is empty: no extreme to take")
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
    """``softmax_m``: one 2-D shape."""
    check_same_shape(h, "softmax_m", m, out)
    check_ndim("softmax_m", m, 2, "m")


def index_m_by_v(h, m, v, out):
    """``index_m_by_v``: m (r, c), v and out (r, 1)."""
    check_ndim("index_m_by_v", m, 2, "m")
    rows = m.shape[0]
    if v.shape != (rows, 1) or out.shape != (rows, 1):
        fail_value("index_m_by_v", f"for m {m.shape}, v and out must be ({rows}, 1); "
                                   f"got v {v.shape}, out {out.shape}")


def binarize_v(h, v, out):
    """``binarize_v``: out (r, c), v (r, 1)."""
    check_ndim("binarize_v", out, 2, "out")
    if v.shape != (out.shape[0], 1):
        fail_value("binarize_v", f"v shape {v.shape} must be ({out.shape[0]}, 1) "
                                 f"for out {out.shape}")


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


def split_t(h, a, axis, out_a, out_b):
    """``split_t``: a is out_a then out_b along ``axis``; returns the axis."""
    return _pieces("split_t", a, out_a, out_b, axis, ("a", "out_a", "out_b"))
