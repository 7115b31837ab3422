"""conv2d and 2-D pooling, per handler and dtype, against direct loops.

The references below are written from the definitions, independently of the
handlers' im2col/cuDNN/kernel code: plain nested loops over n, k, p, q, c, r,
s in float64 on the inputs as the handler holds them.  The three conv ops are
also checked against each other by the adjoint identity
<conv(x, w), dy> = <x, backward_data(dy, w)> = <w, backward_filter(x, dy)>.
Outputs are poisoned with NaN first, so an element an op fails to write shows.
"""
import math

import numpy as np
import pytest

from helpers import (
    act_reference,
    assert_close,
    assert_epilogue_close,
    assert_unchanged,
    by_dtype,
    other_dtype,
    poisoned,
    rand,
    upload,
)

#: these ops run on the float16 and bfloat16 NumpyHandler too (conftest)
HALF_FORMATS = True


def _pair(v):
    return tuple(v) if isinstance(v, tuple) else (v, v)


def _out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


# ---------------------------------------------------------------- references
def ref_conv(x, w, dy, stride, padding, dilation):
    """(y, dx, dw) by direct loops: y = conv(x, w); dx, dw the gradients of
    <y, dy> with respect to x and w."""
    (sh, sw), (ph, pw), (dh, dw_) = _pair(stride), _pair(padding), _pair(dilation)
    n_, c_, h_, w_ = x.shape
    k_, _, r_, s_ = w.shape
    p_, q_ = _out_size(h_, r_, sh, ph, dh), _out_size(w_, s_, sw, pw, dw_)
    y = np.zeros((n_, k_, p_, q_))
    dx, dw = np.zeros(x.shape), np.zeros(w.shape)
    for n in range(n_):
        for k in range(k_):
            for p in range(p_):
                for q in range(q_):
                    for c in range(c_):
                        for r in range(r_):
                            for s in range(s_):
                                i, j = p * sh - ph + r * dh, q * sw - pw + s * dw_
                                if 0 <= i < h_ and 0 <= j < w_:
                                    y[n, k, p, q] += x[n, c, i, j] * w[k, c, r, s]
                                    if dy is not None:
                                        dx[n, c, i, j] += dy[n, k, p, q] * w[k, c, r, s]
                                        dw[k, c, r, s] += dy[n, k, p, q] * x[n, c, i, j]
    return y, dx, dw


def ref_pool(x, window, stride, padding, kind):
    """(out, argmax) of max or average pooling (padding excluded), by loops."""
    (wh, ww), (ph, pw) = _pair(window), _pair(padding)
    sh, sw = _pair(window if stride is None else stride)
    n_, c_, h_, w_ = x.shape
    p_, q_ = _out_size(h_, wh, sh, ph, 1), _out_size(w_, ww, sw, pw, 1)
    out, arg = np.zeros((n_, c_, p_, q_)), np.zeros((n_, c_, p_, q_))
    for n in range(n_):
        for c in range(c_):
            for p in range(p_):
                for q in range(q_):
                    best, at, total, count = None, None, 0.0, 0
                    for r in range(wh):
                        for s in range(ww):
                            i, j = p * sh - ph + r, q * sw - pw + s
                            if not (0 <= i < h_ and 0 <= j < w_):
                                continue
                            v = x[n, c, i, j]
                            total += v
                            count += 1
                            if best is None or (not math.isnan(best) and
                                                (math.isnan(v) or v > best)):
                                best, at = v, r * ww + s   # the index within the window
                    out[n, c, p, q] = best if kind == "max" else total / count
                    arg[n, c, p, q] = at
    return out, arg


def ref_pool_backward(dy, arg, x_shape, window, stride, padding, kind):
    """dx of max (through arg) or average pooling, by loops over the windows."""
    (wh, ww), (ph, pw) = _pair(window), _pair(padding)
    sh, sw = _pair(window if stride is None else stride)
    n_, c_, h_, w_ = x_shape
    dx = np.zeros(x_shape)
    for n in range(n_):
        for c in range(c_):
            for p in range(dy.shape[2]):
                for q in range(dy.shape[3]):
                    cells = [(p * sh - ph + r, q * sw - pw + s) for r in range(wh)
                             for s in range(ww)]
                    cells = [(i, j) for i, j in cells if 0 <= i < h_ and 0 <= j < w_]
                    if kind == "max":
                        r, s = divmod(int(arg[n, c, p, q]), ww)
                        dx[n, c, p * sh - ph + r, q * sw - pw + s] += dy[n, c, p, q]
                    else:
                        for i, j in cells:
                            dx[n, c, i, j] += dy[n, c, p, q] / len(cells)
    return dx


# ---------------------------------------------------------------- convolution
# (N, C, H, W), (K, R, S), stride, padding, dilation
CONV_CASES = [
    ((2, 3, 7, 6), (4, 3, 2), 1, 0, 1),
    ((2, 2, 9, 8), (3, 3, 3), 2, 1, 1),                  # stride 2, padding 1
    ((1, 1, 7, 9), (2, 2, 3), (2, 1), (2, 1), 2),        # C=1, dilation 2, padding 2
    ((3, 4, 5, 5), (2, 1, 1), 1, 0, 1),                  # 1x1 kernel
    ((2, 3, 8, 7), (5, 3, 2), (1, 2), 2, (2, 1)),        # non-square everything
    ((1, 2, 6, 6), (2, 5, 5), 1, 2, 1),                  # "same" 5x5
    ((2, 1, 5, 7), (1, 3, 1), 3, (1, 0), 1),             # stride 3, odd sizes
]


def _conv_id(case):
    (n, c, h, w), (k, r, s), st, pad, dil = case
    return f"x{n}x{c}x{h}x{w}-w{k}x{r}x{s}-s{st}-p{pad}-d{dil}".replace(" ", "")


@pytest.fixture(params=CONV_CASES, ids=[_conv_id(c) for c in CONV_CASES])
def conv_case(request, handler, rng):
    """Handler arrays x, w, dy and their float64 values, and the geometry."""
    xs, (k, r, s), stride, padding, dilation = request.param
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    ys = (xs[0], k, _out_size(xs[2], r, sh, ph, dh), _out_size(xs[3], s, sw, pw, dw))
    x, xv = upload(handler, rand(xs, rng))
    w, wv = upload(handler, rand((k, xs[1], r, s), rng))
    dy, dyv = upload(handler, rand(ys, rng))
    return dict(x=x, xv=xv, w=w, wv=wv, dy=dy, dyv=dyv, stride=stride, padding=padding,
                dilation=dilation)


def test_conv2d_forward(handler, conv_case):
    c = conv_case
    y_ref, _, _ = ref_conv(c["xv"], c["wv"], None, c["stride"], c["padding"], c["dilation"])
    out = poisoned(handler, y_ref.shape)
    handler.conv2d_forward(c["x"], c["w"], out, c["stride"], c["padding"], c["dilation"])
    assert_close(handler, out, y_ref, n=int(np.prod(c["wv"].shape[1:])))
    assert_unchanged(handler, c["x"], c["xv"], "x")
    assert_unchanged(handler, c["w"], c["wv"], "w")


@pytest.mark.parametrize("act", [None, "relu", "gelu_tanh"])
def test_conv2d_bias_act(handler, conv_case, rng, act):
    """act(conv + bias) against float64 NumPy.  On a GPU, None and ReLU run
    as one cuDNN graph where cuDNN plans it; else the convolution, then a
    fused op, which in a half format rounds the convolution first (the
    op's doc): one more rounding of it, which the bias can cancel."""
    c = conv_case
    y_ref, _, _ = ref_conv(c["xv"], c["wv"], None, c["stride"], c["padding"], c["dilation"])
    k = y_ref.shape[1]
    bias, bv = upload(handler, rand((k,), rng))
    expected = act_reference(act, y_ref + bv.reshape(1, k, 1, 1))
    out = poisoned(handler, y_ref.shape)
    assert handler.conv2d_bias_act(c["x"], c["w"], bias, out, c["stride"], c["padding"],
                                   c["dilation"], act) is None
    assert_epilogue_close(handler, out, expected, y_ref, int(np.prod(c["wv"].shape[1:])) + 1)
    assert_unchanged(handler, c["x"], c["xv"], "x")
    assert_unchanged(handler, bias, bv, "bias")


def test_conv2d_backward_data(handler, conv_case):
    c = conv_case
    _, dx_ref, _ = ref_conv(c["xv"], c["wv"], c["dyv"], c["stride"], c["padding"],
                            c["dilation"])
    dx = poisoned(handler, dx_ref.shape)
    handler.conv2d_backward_data(c["dy"], c["w"], dx, stride=c["stride"],
                                 padding=c["padding"], dilation=c["dilation"])
    k, _, r, s = c["wv"].shape
    assert_close(handler, dx, dx_ref, n=k * r * s)


def test_conv2d_backward_filter(handler, conv_case):
    c = conv_case
    _, _, dw_ref = ref_conv(c["xv"], c["wv"], c["dyv"], c["stride"], c["padding"],
                            c["dilation"])
    dw = poisoned(handler, dw_ref.shape)
    handler.conv2d_backward_filter(c["x"], c["dy"], dw, stride=c["stride"],
                                   padding=c["padding"], dilation=c["dilation"])
    n, _, p, q = c["dyv"].shape
    assert_close(handler, dw, dw_ref, n=n * p * q)


def test_conv2d_adjoint_identity(handler, conv_case):
    """<conv(x, w), dy> = <x, backward_data(dy, w)> = <w, backward_filter(x, dy)>."""
    c = conv_case
    args = (c["stride"], c["padding"], c["dilation"])
    y, dx, dw = (poisoned(handler, a.shape) for a in (c["dyv"], c["xv"], c["wv"]))
    handler.conv2d_forward(c["x"], c["w"], y, *args)
    handler.conv2d_backward_data(c["dy"], c["w"], dx, *args)
    handler.conv2d_backward_filter(c["x"], c["dy"], dw, *args)
    get = handler.get_numpy_copy
    lhs = np.vdot(get(y).astype(np.float64), c["dyv"])
    via_x = np.vdot(c["xv"], get(dx).astype(np.float64))
    via_w = np.vdot(c["wv"], get(dw).astype(np.float64))
    scale = np.abs(c["dyv"]).sum() * np.abs(c["wv"]).sum()   # bounds every term's size
    tol = by_dtype(handler, 2e-6, 1e-13) * scale
    assert abs(lhs - via_x) <= tol and abs(lhs - via_w) <= tol, (lhs, via_x, via_w)


def test_conv2d_gradient_regions_no_window_reaches_are_zero(handler, rng):
    # H = 6 with a 3x3 kernel, stride 2, no padding: row and column 5 feed no output.
    x, xv = upload(handler, rand((1, 2, 6, 6), rng))
    w, wv = upload(handler, rand((3, 2, 3, 3), rng))
    dy, dyv = upload(handler, rand((1, 3, 2, 2), rng))
    dx = poisoned(handler, (1, 2, 6, 6))
    handler.conv2d_backward_data(dy, w, dx, 2)
    got = handler.get_numpy_copy(dx)
    assert (got[:, :, 5, :] == 0).all() and (got[:, :, :, 5] == 0).all()
    assert_close(handler, dx, ref_conv(xv, wv, dyv, 2, 0, 1)[1], n=27)


# ---------------------------------------------------------------- pooling
# (N, C, H, W), window, stride (None: the window), padding
POOL_CASES = [
    ((2, 3, 6, 8), 2, None, 0),
    ((2, 2, 7, 9), 3, 2, 1),                     # overlapping windows, padding
    ((1, 1, 5, 5), (3, 2), 1, (1, 0)),           # stride 1 < window, C=1
    ((2, 3, 9, 7), (3, 4), (2, 3), (2, 1)),      # padding 2, non-square
    ((3, 2, 4, 5), 1, 1, 0),                     # 1x1 window: identity
    ((1, 2, 5, 6), (5, 6), None, 0),             # one window per plane
]


def _pool_id(case):
    return "-".join(str(v).replace(" ", "") for v in case)


@pytest.mark.parametrize("case", POOL_CASES, ids=[_pool_id(c) for c in POOL_CASES])
def test_maxpool2d(handler, rng, case):
    xs, window, stride, padding = case
    x, xv = upload(handler, rand(xs, rng))
    out_ref, arg_ref = ref_pool(xv, window, stride, padding, "max")
    out, arg = poisoned(handler, out_ref.shape), poisoned(handler, out_ref.shape)
    handler.maxpool2d_forward(x, out, arg, window, stride, padding)
    assert_close(handler, out, out_ref, rtol=0, atol=0)
    assert_close(handler, arg, arg_ref, rtol=0, atol=0)
    dy, dyv = upload(handler, rand(out_ref.shape, rng))
    dx = poisoned(handler, xs)
    handler.maxpool2d_backward(arg, dy, dx, window, stride, padding)
    kh, kw = _pair(window)
    assert_close(handler, dx, ref_pool_backward(dyv, arg_ref, xs, window, stride, padding,
                                                "max"), n=kh * kw)
    assert_unchanged(handler, x, xv, "x")


@pytest.mark.parametrize("case", POOL_CASES, ids=[_pool_id(c) for c in POOL_CASES])
def test_avgpool2d(handler, rng, case):
    xs, window, stride, padding = case
    kh, kw = _pair(window)
    x, xv = upload(handler, rand(xs, rng))
    out_ref, _ = ref_pool(xv, window, stride, padding, "avg")
    out = poisoned(handler, out_ref.shape)
    handler.avgpool2d_forward(x, out, window, stride, padding)
    assert_close(handler, out, out_ref, n=kh * kw)
    dy, dyv = upload(handler, rand(out_ref.shape, rng))
    dx = poisoned(handler, xs)
    handler.avgpool2d_backward(dy, dx, window, stride, padding)
    assert_close(handler, dx, ref_pool_backward(dyv, None, xs, window, stride, padding, "avg"),
                 n=kh * kw)


def test_maxpool2d_ties_nan_and_infinities(handler):
    x = np.array([[[[1.0, 3.0, 3.0, -np.inf],
                    [3.0, 0.0, -np.inf, -np.inf],
                    [np.nan, 2.0, 5.0, np.nan],
                    [7.0, np.nan, 5.0, 1.0]]]])
    xa = handler.create_from_numpy(x)
    out, arg = poisoned(handler, (1, 1, 3, 3)), poisoned(handler, (1, 1, 3, 3))
    handler.maxpool2d_forward(xa, out, arg, 2, 1, 0)   # overlapping 2x2 windows
    got_out, got_arg = (handler.get_numpy_copy(a).astype(np.float64) for a in (out, arg))
    np.testing.assert_array_equal(got_out, [[[[3, 3, 3], [np.nan, 5, np.nan],
                                              [np.nan, np.nan, np.nan]]]])
    # each index counts within its own 2x2 window: r * 2 + s
    np.testing.assert_array_equal(got_arg, [[[[1, 0, 0], [2, 3, 3], [0, 2, 1]]]])
    # All -inf next to padding: the index is an element of x, never the padding.
    corner = handler.create_from_numpy(np.full((1, 1, 2, 2), -np.inf))
    out, arg = poisoned(handler, (1, 1, 3, 3)), poisoned(handler, (1, 1, 3, 3))
    handler.maxpool2d_forward(corner, out, arg, 2, 1, 1)
    np.testing.assert_array_equal(handler.get_numpy_copy(arg).astype(np.float64),
                                  [[[[3, 2, 2], [1, 0, 0], [1, 0, 0]]]])
    np.testing.assert_array_equal(handler.get_numpy_copy(out).astype(np.float64),
                                  np.full((1, 1, 3, 3), -np.inf))


def test_maxpool2d_backward_ignores_indices_outside_their_window(handler, rng):
    dy, dyv = upload(handler, rand((1, 1, 2, 2), rng))
    # A 2x2 window has indices 0-3: 4.0 (past the window), NaN, -1 and 2.5
    # name no element of their windows and add nothing.
    arg = handler.create_from_numpy(np.array([[[[4.0, np.nan], [-1.0, 2.5]]]]))
    dx = poisoned(handler, (1, 1, 4, 4))
    handler.maxpool2d_backward(arg, dy, dx, 2)
    np.testing.assert_array_equal(handler.get_numpy_copy(dx), np.zeros((1, 1, 4, 4)))


# ---------------------------------------------------------------- bad input
def _conv_arrays(handler, rng, x=(2, 3, 5, 6), w=(4, 3, 3, 2), y=(2, 4, 3, 5)):
    return [upload(handler, rand(s, rng)) for s in (x, w, y)]


@pytest.mark.parametrize("shapes,kwargs,exc,match", [
    (dict(w=(4, 2, 3, 2)), {}, ValueError, r"channels differ.*\(4, 2, 3, 2\)"),
    (dict(x=(2, 3, 30)), {}, ValueError, r"x must be 4-D"),
    (dict(y=(2, 4, 3, 4)), {}, ValueError, r"out must have shape \(2, 4, 3, 5\)"),
    ({}, dict(stride=2), ValueError, r"out must have shape \(2, 4, 2, 3\)"),
    ({}, dict(stride=0), ValueError, r"stride must be positive"),
    ({}, dict(dilation=(1, -2)), ValueError, r"dilation must be positive"),
    ({}, dict(padding=-1), ValueError, r"padding must be non-negative"),
    ({}, dict(stride=1.5), TypeError, r"stride must be an int or a pair"),
    ({}, dict(dilation=4), ValueError, r"no output"),
])
def test_conv2d_forward_rejects(handler, rng, shapes, kwargs, exc, match):
    (x, xv), (w, wv), (out, outv) = _conv_arrays(handler, rng, **shapes)
    with pytest.raises(exc, match=f"conv2d_forward: .*{match}"):
        handler.conv2d_forward(x, w, out, **kwargs)
    assert_unchanged(handler, out, outv, "out")


def test_conv2d_rejects_wrong_dtype_and_overlap(handler, rng, sibling_handler, handler_id):
    (x, _), (w, _), (out, outv) = _conv_arrays(handler, rng)
    other = sibling_handler(handler_id, other_dtype(handler.dtype))
    with pytest.raises(TypeError, match="conv2d_forward: expected dtype"):
        handler.conv2d_forward(x, other.create_from_numpy(rand((4, 3, 3, 2), rng)), out)
    assert_unchanged(handler, out, outv, "out")
    # dw over x's memory (views of the same buffer, through the contract's
    # own view ops, which every handler provides: a failure here is a failure)
    base = handler.create_from_numpy(rand((1, 180), rng))
    xs = handler.reshape_t(base, (2, 3, 5, 6))
    dw = handler.view_t(base, 0, (4, 3, 3, 2))
    before = handler.get_numpy_copy(base).astype(np.float64)
    dy, _ = upload(handler, rand((2, 4, 3, 5), rng))
    with pytest.raises(ValueError, match="conv2d_backward_filter: dw must not overlap x"):
        handler.conv2d_backward_filter(xs, dy, dw)
    assert_unchanged(handler, base, before, "x and dw")


@pytest.mark.parametrize("op,kwargs,match", [
    ("maxpool2d_forward", dict(window=2, padding=2), r"padding \(2, 2\) must be smaller"),
    ("maxpool2d_forward", dict(window=0), r"window must be positive"),
    ("maxpool2d_forward", dict(window=2, stride=(2, 0)), r"stride must be positive"),
    ("maxpool2d_forward", dict(window=(7, 2)), r"no output"),
    ("maxpool2d_forward", dict(window=3), r"out must have shape \(2, 3, 1, 2\)"),
    ("avgpool2d_forward", dict(window=2, stride=1), r"out must have shape \(2, 3, 4, 5\)"),
    ("avgpool2d_forward", dict(window=(2, 2, 2)), r"window must be an int or a pair"),
])
def test_pool_rejects(handler, rng, op, kwargs, match):
    x, _ = upload(handler, rand((2, 3, 5, 6), rng))
    out, outv = upload(handler, rand((2, 3, 2, 3), rng))
    arg, argv = upload(handler, rand((2, 3, 2, 3), rng))
    args = (x, out, arg) if op.startswith("max") else (x, out)
    with pytest.raises((ValueError, TypeError), match=f"{op}: {match}"):
        getattr(handler, op)(*args, **kwargs)
    assert_unchanged(handler, out, outv, "out")
    assert_unchanged(handler, arg, argv, "argmax")


def test_maxpool_outputs_must_not_overlap(handler, rng):
    x, _ = upload(handler, rand((2, 3, 4, 4), rng))
    out, outv = upload(handler, rand((2, 3, 2, 2), rng))
    with pytest.raises(ValueError, match="maxpool2d_forward: out must not overlap argmax"):
        handler.maxpool2d_forward(x, out, out, 2)
    assert_unchanged(handler, out, outv, "out")


# ---------------------------------------------------------------- a small network
def _conv_refs(x, w, dy, pad):
    """(y, dx, dw) of a stride-1 conv2d with zero padding ``pad``, in float64
    by sums over the kernel's offsets (``dy`` None: y alone)."""
    k_, _, r_, s_ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    p_, q_ = xp.shape[2] - r_ + 1, xp.shape[3] - s_ + 1
    y = np.zeros((x.shape[0], k_, p_, q_))
    dxp, dw = np.zeros(xp.shape), np.zeros(w.shape)
    for r in range(r_):
        for s in range(s_):
            xw = xp[:, :, r:r + p_, s:s + q_]
            y += np.einsum("ncpq,kc->nkpq", xw, w[:, :, r, s])
            if dy is not None:
                dw[:, :, r, s] = np.einsum("nkpq,ncpq->kc", dy, xw)
                dxp[:, :, r:r + p_, s:s + q_] += np.einsum("nkpq,kc->ncpq", dy, w[:, :, r, s])
    dx = dxp[:, :, pad:pad + x.shape[2], pad:pad + x.shape[3]]
    return y, dx, dw


def _windows_2x2(x):
    """The 2x2 stride-2 windows of x (N, C, H, W) as (N, C, H/2, W/2, 4),
    element r * 2 + s of a window at row r, column s."""
    n, c, hh, ww = x.shape
    return x.reshape(n, c, hh // 2, 2, ww // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
        n, c, hh // 2, ww // 2, 4)


def _from_windows_2x2(win):
    """The inverse of _windows_2x2."""
    n, c, p, q, _ = win.shape
    return win.reshape(n, c, p, q, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, 2 * p, 2 * q)


def test_lenet_sized_step_runs_and_matches_float64(handler, rng):
    """One forward and backward of a LeNet-like stack on 28x28 inputs (conv
    5x5 padding 2, max pool 2, conv 5x5, average pool 2, and back): every
    op's result matches a float64 NumPy reference (sums over the kernel's
    offsets, pooling by 2x2 windows, written here) computed on its inputs as
    the handler holds them, so that a rounding upstream is not blamed
    downstream; the max pool's values and argmax exactly."""
    held = lambda a: handler.get_numpy_copy(a).astype(np.float64)   # noqa: E731
    x, xv = upload(handler, rand((16, 1, 28, 28), rng))
    w1, w1v = upload(handler, rand((6, 1, 5, 5), rng, -0.3, 0.3))
    h1 = poisoned(handler, (16, 6, 28, 28))
    handler.conv2d_forward(x, w1, h1, 1, 2)
    assert_close(handler, h1, _conv_refs(xv, w1v, None, 2)[0], n=25, err_msg="conv1")
    p1, a1 = poisoned(handler, (16, 6, 14, 14)), poisoned(handler, (16, 6, 14, 14))
    # indices within the 2x2 window: exact in every format (bfloat16 included)
    handler.maxpool2d_forward(h1, p1, a1, 2)
    win = _windows_2x2(held(h1))
    arg = win.argmax(axis=-1)                       # the first of equals, row-major
    np.testing.assert_array_equal(held(p1), win.max(axis=-1), err_msg="max pool")
    np.testing.assert_array_equal(held(a1), arg, err_msg="max pool argmax")
    w2, w2v = upload(handler, rand((16, 6, 5, 5), rng, -0.3, 0.3))
    h2 = poisoned(handler, (16, 16, 10, 10))
    handler.conv2d_forward(p1, w2, h2)
    p1v = held(p1)
    assert_close(handler, h2, _conv_refs(p1v, w2v, None, 0)[0], n=150, err_msg="conv2")
    p2 = poisoned(handler, (16, 16, 5, 5))
    handler.avgpool2d_forward(h2, p2, 2)
    assert_close(handler, p2, _windows_2x2(held(h2)).mean(axis=-1), n=4, err_msg="avg pool")
    g2 = poisoned(handler, (16, 16, 10, 10))
    dp2, dp2v = upload(handler, rand((16, 16, 5, 5), rng))
    handler.avgpool2d_backward(dp2, g2, 2)
    assert_close(handler, g2, _from_windows_2x2(np.repeat(dp2v[..., None] / 4, 4, axis=-1)),
                 err_msg="avg pool backward")
    gp1, gw2 = poisoned(handler, (16, 6, 14, 14)), poisoned(handler, (16, 6, 5, 5))
    handler.conv2d_backward_data(g2, w2, gp1)
    handler.conv2d_backward_filter(p1, g2, gw2)
    _, gp1_ref, gw2_ref = _conv_refs(p1v, w2v, held(g2), 0)
    assert_close(handler, gp1, gp1_ref, n=16 * 25, err_msg="conv2 backward data")
    assert_close(handler, gw2, gw2_ref, n=16 * 10 * 10, err_msg="conv2 backward filter")
    gh1 = poisoned(handler, (16, 6, 28, 28))
    handler.maxpool2d_backward(a1, gp1, gh1, 2)
    routed = (np.arange(4) == arg[..., None]) * held(gp1)[..., None]
    assert_close(handler, gh1, _from_windows_2x2(routed), err_msg="max pool backward")
    gw1 = poisoned(handler, (6, 1, 5, 5))
    handler.conv2d_backward_filter(x, gh1, gw1, 1, 2)
    assert_close(handler, gw1, _conv_refs(xv, w1v, held(gh1), 2)[2], n=16 * 28 * 28,
                 err_msg="conv1 backward filter")


# ---------------------------------------------------------------- LeNet sizes, engine choice
LENET = pytest.mark.parametrize("shapes", [((64, 1, 28, 28), (6, 1, 5, 5)),
                                           ((64, 6, 12, 12), (16, 6, 5, 5))],
                                ids=["lenet1", "lenet2"])


def _check_lenet_layer(h, rng, shapes):
    """conv2d's three passes on one LeNet layer (stride 1, no padding) against
    float64 references by vectorized sums over the kernel's offsets.  On the
    GPU, also that no engine chosen carries a numerical note the handler's
    policy refuses."""
    (xs, ws) = shapes
    x, xv = upload(h, rand(xs, rng))
    w, wv = upload(h, rand(ws, rng))
    ys = (xs[0], ws[0], xs[2] - ws[2] + 1, xs[3] - ws[3] + 1)
    dy, dyv = upload(h, rand(ys, rng))
    y_ref, dx_ref, dw_ref = np.zeros(ys), np.zeros(xs), np.zeros(ws)
    for r in range(ws[2]):
        for s in range(ws[3]):
            xw = xv[:, :, r:r + ys[2], s:s + ys[3]]
            y_ref += np.einsum("ncpq,kc->nkpq", xw, wv[:, :, r, s])
            dw_ref[:, :, r, s] = np.einsum("nkpq,ncpq->kc", dyv, xw)
            dx_ref[:, :, r:r + ys[2], s:s + ys[3]] += np.einsum("nkpq,kc->ncpq", dyv,
                                                               wv[:, :, r, s])
    y, dx, dw = poisoned(h, ys), poisoned(h, xs), poisoned(h, ws)
    h.conv2d_forward(x, w, y)
    h.conv2d_backward_data(dy, w, dx)
    h.conv2d_backward_filter(x, dy, dw)
    assert_close(h, y, y_ref, n=ws[1] * ws[2] * ws[3], err_msg="forward")
    assert_close(h, dx, dx_ref, n=ws[0] * ws[2] * ws[3], err_msg="backward data")
    assert_close(h, dw, dw_ref, n=ys[0] * ys[2] * ys[3], err_msg="backward filter")
    if hasattr(h, "_conv_plans"):
        from handlers.cuda.convolution import (
            DENIED_ENGINES,
            cudnn_note_names,
            refused_notes,
        )
        for key, plan in h._conv_plans.items():
            refused = refused_notes(key[0] != 0, h._half, h.deterministic)
            assert not plan[3] & refused, (key, cudnn_note_names(plan[3] & refused))
            assert plan[2] not in DENIED_ENGINES[key[0]], key


@LENET
def test_lenet_sizes_match_the_reference(handler, rng, shapes):
    """At LeNet sizes (sums of up to 36864 terms) cuDNN ranks other engines
    than for the small cases above.  Before the handler refused or denied
    them, a Winograd engine (bfloat16 backward data) missed this tolerance
    51-fold, and backward-filter engine 17 21-fold in float32 (see
    handlers/cuda/convolution.py, DENIED_ENGINES)."""
    _check_lenet_layer(handler, rng, shapes)


@LENET
def test_nondeterministic_engines_give_the_reference_gradients(handler, rng, shapes):
    """``PyCudaHandler(deterministic=False)`` lets cuDNN's backward passes
    add with atomics; the gradients still match the float64 reference."""
    if not hasattr(handler, "deterministic"):
        pytest.skip("engine choice is PyCudaHandler's (cuDNN)")
    if handler._half:
        pytest.skip("deterministic=False applies to float32 and float64 only")
    h = type(handler)(handler.dtype, seed=0, deterministic=False)
    assert h.deterministic is False and h.twin(np.float64 if h.dtype != np.float64
                                               else np.float32).deterministic is False
    _check_lenet_layer(h, rng, shapes)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        type(handler)(handler.dtype, deterministic=1)


def test_planned_inside_a_capture(handler, rng):
    """A geometry first met inside a capture is planned there (on a GPU
    without timing engines: the heuristics' first pick); the replay gives
    the reference and an eager call afterwards the very same bits."""
    h = type(handler)(handler.dtype, seed=0)   # a fresh plan cache
    xs, ws = (8, 3, 10, 10), (4, 3, 3, 3)
    x, xv = upload(h, rand(xs, rng))
    w, wv = upload(h, rand(ws, rng))
    y = poisoned(h, (8, 4, 10, 10))
    graph = h.capture(lambda: h.conv2d_forward(x, w, y, 1, 1))
    graph.replay()
    y_ref = ref_conv(xv, wv, None, 1, 1, 1)[0]
    assert_close(h, y, y_ref, n=27)
    replayed = h.get_numpy_copy(y)
    y2 = poisoned(h, y.shape)
    h.conv2d_forward(x, w, y2, 1, 1)
    np.testing.assert_array_equal(h.get_numpy_copy(y2), replayed)


def test_engine_policy():
    """Which cuDNN numerical notes rule an engine out (host-side policy,
    checked without a GPU; the GPU tests above check the chosen engines)."""
    cm = pytest.importorskip("handlers.cuda.convolution")
    names = cm.cudnn_note_names
    for backward in (False, True):
        for deterministic in (False, True):
            f32 = set(names(cm.refused_notes(backward, False, deterministic)))
            half = set(names(cm.refused_notes(backward, True, deterministic)))
            always = {"down_convert_inputs", "reduced_precision_reduction"}
            assert always <= f32 and always <= half
            # float32/float64 never on tensor cores (TF32); halves may be
            assert "tensor_core" in f32 and "tensor_core" not in half
            # the halves refuse transforms that round to the half format
            assert {"fft", "winograd", "winograd_tile_4x4"} <= half
            assert "fft" not in f32
            # atomics only in float32/float64 backward passes, when allowed
            assert ("nondeterministic" in f32) == (backward and deterministic)
            assert ("nondeterministic" in half) == backward
    assert names(cm.note_mask("fft", "strict_nan_prop")) == ["fft", "strict_nan_prop"]
    assert 17 in cm.DENIED_ENGINES[2]


def test_conv_and_pool_planning():
    """PyCudaHandler's planning without a GPU: which array plays x, w and y
    in each cuDNN pass, the stride clamp, the conv_engines list and its
    pins, and a pooling launch's kernel, grid and arguments."""
    cm = pytest.importorskip("handlers.cuda.convolution")
    x, w, y = (2, 3, 9, 9), (4, 3, 3, 3), (2, 4, 7, 7)
    dims = (2, 3, 9, 9, 4, 3, 3, 7, 7, 1, 1, 0, 0, 1, 1)
    one = ((1, 1), (0, 0), (1, 1))
    assert cm.conv_dims(0, x, w, y, *one) == dims                # (x, w, y)
    assert cm.conv_dims(1, y, w, x, *one) == dims                # (dy, w, dx)
    assert cm.conv_dims(2, x, y, w, *one) == dims                # (x, dy, dw)
    # a stride past the padded input is clamped to it
    assert cm.conv_dims(0, x, w, (2, 4, 1, 1), (50, 2), (1, 0), (1, 1))[9:11] == (11, 2)
    key = (2, 1, x, y, w, (1, 1), (0, 0), (1, 1), 16)
    listed = cm.engines({key: (0, 0, 18, 0)})
    assert listed == [[2, 1, list(x), list(y), list(w), [1, 1], [0, 0], [1, 1], 18]]
    assert cm.engine_pins(listed) == {key[:-1]: 18}
    with pytest.raises(ValueError, match="expected a list from conv_engines"):
        cm.engine_pins([[2, 1, list(x), 18]])
    fwd = cm.pool_launch("max", (2, 3, 8, 8), (2, 3, 4, 4), (2, 2), (2, 2), (0, 0), 1000)
    assert fwd == ("pool_fwd", 1, False, (6, 8, 8, 4, 4, 2, 2, 2, 2, 0, 0, 0))
    bwd = cm.pool_launch("avg_backward", (2, 3, 4, 4), (2, 3, 8, 8), (2, 2), (99, 2), (1, 0), 1)
    assert bwd == ("pool_bwd", 1, True, (6, 8, 8, 4, 4, 2, 2, 10, 2, 1, 0, 1))
    assert cm.pool_launch("max", (64, 64, 56, 56), (64, 64, 28, 28), (2, 2), (2, 2), (0, 0),
                          8).grid == 8
