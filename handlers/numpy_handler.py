"""NumpyHandler: the Handler contract on the CPU with NumPy.

Every op writes into its output with ``out=``.  Where an op needs an
intermediate (``dot_add_mm``, ``mult_add_tt``, some derivatives), it uses a
scratch array cached per shape and per thread instead of allocating on every
call.  Ops run at once, which is a valid schedule for every stream group, so
events are complete when they are recorded.
"""
import threading

import numpy as np

from . import blas_threads, dtypes
from .base import CONV_EPILOGUES, Handler
from .checks import fail_type, fail_value
from .graphs import WORK_HOOKS
from .prefetch import Transfer
from .shape_rules import reduced_size


class CompletedEvent:
    """An event that is complete from the start (NumpyHandler runs ops at once)."""

    def query(self):
        """Return True: the work before the event has finished."""
        return True

    def synchronize(self):
        """Return at once: there is nothing to wait for."""


class DoneCopy:
    """Handle of a finished copy (``get_numpy_copy_async`` on NumpyHandler)."""

    def __init__(self, out):
        self._out = out

    def done(self):
        """Return True: the copy has finished."""
        return True

    def result(self):
        """Return the copied NumPy array."""
        return self._out


class _PerThread(threading.local):
    """A ``cache`` dict of each thread's own."""

    def __init__(self):
        self.cache = {}


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


class NumpyHandler(Handler):
    """Handler whose arrays are C-contiguous ``numpy.ndarray`` of ``dtype``."""

    array_type = np.ndarray
    refused_array_types = (np.matrix, np.ma.MaskedArray)
    read_only_arrays = True   # np.frombuffer over bytes, say
    collective_backend = "mpi"   # host arrays: MPI itself

    supported_dtypes = ("float32", "float64", "float16", "bfloat16")

    def __init__(self, dtype=np.float32, seed=None, num_stream_groups=4):
        super().__init__(dtype, seed, num_stream_groups)
        self._rng = np.random.default_rng(seed)
        # Scratch buffers per thread: ops from several threads run at once.
        self._scratch_local = _PerThread()
        # Half formats compute in float32 and round once on store: every work
        # hook runs on this float32 twin, which draws from the same generator
        # (see _widened).  None for float32 and float64.
        self._wide = None
        if dtypes.is_half(self.dtype):
            self._wide = NumpyHandler(np.float32, num_stream_groups=1)
            self._wide._rng = self._rng

    def _make_twin(self, dtype):
        # Ops run to completion when issued, so any two handlers are ordered:
        # a twin needs only the same group count, and draws from this
        # handler's generator (one random state for the family, as on a GPU).
        twin = NumpyHandler(dtype, seed=self.seed, num_stream_groups=self.num_stream_groups)
        twin._rng = self._rng
        if twin._wide is not None:
            twin._wide._rng = self._rng
        return twin

    def _cast_t(self, src, dst):
        # Half sources are widened to float32 first, so that NumPy does not
        # compute in them; a half dst arrives here as its float32 copy
        # (_widened), rounded back once.
        if src.dtype.itemsize < 4:
            src = src.astype(np.float32)
        np.copyto(dst, src, casting="unsafe")   # beyond dst's range: inf, as on store

    def _scratch(self, shape):
        # One cached buffer per shape and thread: an op runs to completion
        # before its thread issues the next, so a buffer is never used by two
        # ops at once (a buffer shared between threads was: wrong results).
        cache = self._scratch_local.cache
        buf = cache.get(shape)
        if buf is None:
            buf = cache[shape] = np.empty(shape, self.dtype)
        return buf

    def _add_product(self, fn, a, b, out):
        # out += fn(a, b), through the scratch buffer of out's shape.
        tmp = self._scratch(out.shape)
        fn(a, b, out=tmp)
        np.add(out, tmp, out=out)

    # streams ---------------------------------------------------------------
    def _record_event(self):
        return CompletedEvent()

    def _wait_event(self, event):
        if not hasattr(event, "query"):
            fail_type("wait_event", f"expected an event, got {type(event).__name__}")

    def _synchronize(self):
        pass

    def _synchronize_all(self):
        pass

    # input pipeline ----------------------------------------------------------
    def _transfer(self):
        return Transfer(self)   # staged host arrays are the batches themselves

    def _pin(self, array):
        return array

    def _empty_pinned(self, shape):
        return np.empty(shape, self.dtype)

    def _copy_async(self, a, out):
        np.copyto(out, a)
        return DoneCopy(out)

    # memory ----------------------------------------------------------------
    def _allocate(self, shape):
        return np.empty(shape, self.dtype)

    def _fill(self, a, value):
        a.fill(value)

    def _set_from_numpy(self, a, arr):
        np.copyto(a, arr)

    def _wrap(self, obj):
        if not isinstance(obj, np.ndarray) and not hasattr(obj, "__array_interface__"):
            fail_type("create_from_device_array", f"expected an object with the NumPy "
                                                  f"array interface, got {type(obj).__name__}")
        a = np.asarray(obj)
        if a.dtype != self.dtype:
            fail_type("create_from_device_array", f"expected dtype {self.dtype}, got {a.dtype}")
        if not a.flags.c_contiguous:
            raise ValueError(f"create_from_device_array: array of shape {a.shape} is not "
                             f"C-contiguous")
        return a

    def _get_numpy_copy(self, a):
        return a.copy()

    def _copy_to(self, src, dest):
        np.copyto(dest, src)

    def _overlaps(self, a, b):
        return np.may_share_memory(a, b)

    def _span(self, a):
        if not a.size:
            return 0, 0
        start = a.__array_interface__["data"][0]
        return start, start + a.nbytes

    # BLAS ------------------------------------------------------------------
    def _dot(self, a, b, out, transa, transb, beta):
        if out.ndim == 3:   # a batch of products: matmul broadcasts a shared 2-D operand
            a = a.swapaxes(-1, -2) if transa else a
            b = b.swapaxes(-1, -2) if transb else b
            fn = np.matmul
        else:
            a = a.T if transa else a
            b = b.T if transb else b
            fn = np.dot
        # small products on one BLAS thread (blas_threads: why)
        macs = out.size * a.shape[-1]
        if beta == 0.0:
            blas_threads.product(fn, macs, a, b, out=out)
        else:
            blas_threads.product(self._add_product, macs, fn, a, b, out)

    def _axpby(self, alpha, x, beta, y):
        # Device scalars (one-element arrays) are read now, when the op runs.
        if type(alpha) is not float:
            alpha = float(alpha.reshape(-1)[0])
        if type(beta) is not float:
            beta = float(beta.reshape(-1)[0])
        if beta == 0.0:
            np.multiply(x, alpha, out=y)
            return
        # Aliasing is decided on memory: x may be y as another view of it.
        overlap = x is y or np.may_share_memory(x, y)
        if overlap and self._same_memory(x, y):
            np.multiply(y, alpha + beta, out=y)
        elif alpha == 1.0 and not overlap:
            if beta != 1.0:
                np.multiply(y, beta, out=y)
            np.add(y, x, out=y)
        else:
            tmp = self._scratch(x.shape)
            np.multiply(x, alpha, out=tmp)
            if beta != 1.0:
                np.multiply(y, beta, out=y)
            np.add(y, tmp, out=y)

    # optimizers ---------------------------------------------------------------
    def _adam_update(self, g, lr, beta1, beta2, eps, weight_decay, step, m, v, p, decoupled,
                     gate):
        """adam_update in the handler's dtype, in the order of the CUDA kernel's
        arithmetic (kernels/optim.cu)."""
        if type(gate) is not float:
            gate = float(gate.reshape(-1)[0])   # read when the op runs, as lr
        if gate == 0.0:
            return
        if type(lr) is not float:
            lr = float(lr.reshape(-1)[0])   # a device scalar is read when the op runs
        t = float(step.reshape(-1)[0]) + 1.0
        c1, c2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
        pair = self._scratch((2,) + p.shape)
        grad, tmp = pair[0], pair[1]
        if decoupled:
            np.multiply(p, 1.0 - lr * weight_decay, out=p)
            np.copyto(grad, g)
        elif weight_decay != 0.0:
            np.multiply(p, weight_decay, out=grad)
            np.add(grad, g, out=grad)
        else:
            np.copyto(grad, g)
        np.multiply(m, beta1, out=m)
        np.multiply(grad, 1.0 - beta1, out=tmp)
        np.add(m, tmp, out=m)
        np.multiply(v, beta2, out=v)
        np.multiply(grad, grad, out=tmp)
        np.multiply(tmp, 1.0 - beta2, out=tmp)
        np.add(v, tmp, out=v)
        np.divide(v, c2, out=tmp)
        np.sqrt(tmp, out=tmp)
        np.add(tmp, eps, out=tmp)        # eps after the square root, as in PyTorch
        np.divide(m, c1, out=grad)
        np.multiply(grad, lr, out=grad)
        np.divide(grad, tmp, out=grad)
        np.subtract(p, grad, out=p)
        step.fill(t)

    def _scale_finite(self, a, factor, flag):
        # A half a arrives as its float32 copy (_widened), rounded back once.
        if type(factor) is not float:
            factor = float(factor.reshape(-1)[0])
        finite = np.isfinite(a)
        ok = bool(finite.all())
        flag.fill(1.0 if ok else 0.0)
        np.multiply(a, factor, out=a)
        if not ok:   # rare: no mask work on the common, finite step
            np.copyto(a, 0.0, where=~finite)

    def _update_loss_scale(self, flag, state, interval, max_scale):
        # In float64 (every value here is exact in it), stored once in the
        # handler's format: a power-of-two scale and its inverse are exact.
        scale, _, streak, skipped = (float(x) for x in state.astype(np.float64))
        if float(flag.reshape(-1)[0]) == 0.0:
            scale, streak, skipped = scale * 0.5, 0.0, skipped + 1.0
        else:
            streak += 1.0
            if streak >= interval:
                scale, streak = min(scale * 2.0, max_scale), 0.0
        state[...] = np.array([scale, 1.0 / scale, streak, skipped]).astype(state.dtype)

    # reduction --------------------------------------------------------------
    def _sum_t(self, a, axis, out, scale=1.0):
        # scale: mean_t's 1/n in a half format, applied before the one rounding
        if axis is None:
            np.sum(a, axis=None, out=out.reshape((1,) * a.ndim), keepdims=True)
        else:
            np.sum(a, axis=axis, out=out.reshape(_kept(a.shape, axis)), keepdims=True)
        if scale != 1.0:
            np.multiply(out, scale, out=out)

    def _mean_t(self, a, axis, out):
        # A half format rounds once: the sum and its scaling in one work hook
        # (on the float32 twin); float32 and float64 as every handler does.
        n = reduced_size(a.shape, axis)
        if self._wide is None or n == 0:
            super()._mean_t(a, axis, out)
        else:
            self._sum_t(a, axis, out, 1.0 / n)

    def _transpose_m(self, a, out):
        np.copyto(out, a.T)

    def _permute_t(self, a, axes, out):
        np.copyto(out, np.transpose(a, axes))

    def _concat_t(self, a, b, axis, out):
        np.concatenate((a, b), axis=axis, out=out)

    def _split_t(self, a, axis, out_a, out_b):
        k = out_a.shape[axis]
        lead = (slice(None),) * axis
        np.copyto(out_a, a[lead + (slice(0, k),)])
        np.copyto(out_b, a[lead + (slice(k, None),)])

    def _extreme_t(self, kind, a, axis, out):
        kept = out.reshape(_kept(a.shape, axis))
        if kind == "argmax":
            # NumPy's argmax gives ints (and the first NaN's index, as the kernel)
            np.copyto(kept, np.argmax(a, axis=axis, keepdims=True))
        else:
            (np.max if kind == "max" else np.min)(a, axis=axis, out=kept, keepdims=True)

    # elementwise ------------------------------------------------------------
    def _elementwise(self, op, *args):
        op.numpy(self, *args)   # the row's NumPy expression, in place

    def _fused(self, op, *args):
        op.run_numpy(self, *args)   # the declaration's program, in this dtype

    def _broadcast_t(self, a, axis, out):
        np.copyto(out, a)

    def _mv(self, name, m, v, out, orientation):
        _BINARY[name](m, v, out=out)

    # indexing and masks -----------------------------------------------------
    def _valid_index(self, v, n):
        idx = v[:, 0]
        valid = (idx >= 0) & (idx < n)   # NaN compares False: invalid
        return valid, idx[valid].astype(np.intp)

    def _index_m_by_v(self, m, v, out):
        valid, idx = self._valid_index(v, m.shape[1])
        rows = np.flatnonzero(valid)
        vals = m[rows, idx]
        out.fill(np.nan)
        out[rows, 0] = vals

    def _binarize_v(self, v, out):
        valid, idx = self._valid_index(v, out.shape[1])
        out.fill(0.0)
        out[np.flatnonzero(valid), idx] = 1.0

    def _gather_rows(self, table, idx, out):
        np.take(table, _row_ids("gather_rows_m", idx, table.shape[0]), axis=0, out=out)

    def _scatter_add_rows(self, a, idx, out):
        # ufunc.at adds one row after another in index order, repeated indices
        # included: the same order, hence the same bits, as the GPU kernel.
        np.add.at(out, _row_ids("scatter_add_rows_m", idx, out.shape[0]), a)

    def _is_fully_finite(self, a):
        return np.isfinite(a).all()

    # convolution and pooling --------------------------------------------------
    def _conv2d_bias_act(self, x, w, bias, out, stride, padding, dilation, act):
        # Handler's way, but one epilogue over every (image, channel) plane:
        # a host-side column of the bias per plane costs nothing here.
        self._conv2d("forward", x, w, out, stride, padding, dilation)
        n, k = out.shape[:2]
        rows = out.reshape(n * k, -1)
        self._fused(CONV_EPILOGUES[act], rows, np.tile(bias, n).reshape(n * k, 1), rows)

    # im2col tap by tap (_taps), then one BLAS product per pass; the adjoint
    # (_untap) adds each kernel tap's slice back, one strided add per tap, in
    # a fixed order (deterministic, no scatter).
    def _conv2d(self, kind, a, b, out, stride, padding, dilation):
        # The taps form a (C*R*S, N*P*Q) matrix; the dy side is (K, N*P*Q).
        if kind == "forward":                       # a = x, b = w
            k = b.shape[0]
            cols = _taps(a, b.shape[2:], out.shape[2:], stride, padding, dilation)
            res = _matmul(b.reshape(k, -1), cols.reshape(-1, cols[0, 0, 0].size))
            np.copyto(out, res.reshape((k, a.shape[0]) + out.shape[2:]).transpose(1, 0, 2, 3))
        elif kind == "backward_filter":             # a = x, b = dy
            cols = _taps(a, out.shape[2:], b.shape[2:], stride, padding, dilation)
            dy = b.transpose(1, 0, 2, 3).reshape(b.shape[1], -1)
            np.copyto(out, _matmul(dy, cols.reshape(-1, dy.shape[1]).T).reshape(out.shape))
        else:                                       # a = dy, b = w, out = dx
            k = b.shape[0]
            dy = a.transpose(1, 0, 2, 3).reshape(k, -1)
            cols = _matmul(b.reshape(k, -1).T, dy).reshape(b.shape[1:] + (a.shape[0],)
                                                            + a.shape[2:])
            _untap(cols, out, stride, padding, dilation)

    def _pool2d(self, kind, src, dst, argmax, window, stride, padding):
        if kind == "max":
            _maxpool(src, dst, argmax, window, stride, padding)
        elif kind == "avg":
            cols = _windows(src, window, dst.shape[2:], stride, padding, (1, 1), 0.0)
            np.sum(cols, axis=(4, 5), out=dst)
            np.divide(dst, _pool_counts(src.shape[2:], dst.shape[2:], window, stride, padding),
                      out=dst)
        elif kind == "avg_backward":
            counts = _pool_counts(dst.shape[2:], src.shape[2:], window, stride, padding)
            scaled = (src / counts)[:, :, :, :, None, None]
            cols = np.broadcast_to(scaled, src.shape + tuple(window))    # (N, C, P, Q, R, S)
            _untap(cols.transpose(1, 4, 5, 0, 2, 3), dst, stride, padding, (1, 1))
        else:
            _maxpool_backward(argmax, src, dst, window, stride, padding)

    # randomness -------------------------------------------------------------
    def _fill_gaussian(self, mean, std, out):
        self._rng.standard_normal(out=out, dtype=self.dtype)
        np.multiply(out, std, out=out)
        np.add(out, mean, out=out)

    def _probability_mask(self, mask, p):
        self._rng.random(out=mask, dtype=self.dtype)
        np.less(mask, p, out=mask)

    def _random_state(self):
        state = self._rng.bit_generator.state
        return {"generator": f"numpy.{state['bit_generator']}", "state": state}

    def _set_random_state(self, state):
        try:
            # in place: the views, twins and the float32 twin share the object
            self._rng.bit_generator.state = state["state"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"set_random_state: not a state of this generator: {e}") from None


def _matmul(a, b):
    """a @ b for 2-D a and b, small ones on one BLAS thread (``blas_threads``)."""
    return blas_threads.product(np.matmul, a.shape[0] * a.shape[1] * b.shape[1], a, b)


def _taps(x, kernel, out_hw, stride, padding, dilation):
    """The (C, R, S, N, P, Q) array of x's kernel taps, zero-padded:
    element [c, r, s, n, p, q] is x[n, c, p*sh - ph + r*dh, q*sw - pw + s*dw].
    Copied tap by tap (R*S strided copies of whole planes), which NumPy does
    much faster than one copy of a six-axis window view with short inner axes."""
    (ph, pw), (sh, sw), (dh, dw) = padding, stride, dilation
    (r_, s_), (p, q) = kernel, out_hw
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    xt = x.transpose(1, 0, 2, 3)
    cols = np.empty((x.shape[1], r_, s_, x.shape[0], p, q), x.dtype)
    for i in range(r_):
        for j in range(s_):
            cols[:, i, j] = xt[:, :, i * dh:i * dh + sh * (p - 1) + 1:sh,
                               j * dw:j * dw + sw * (q - 1) + 1:sw]
    return cols


def _untap(cols, out, stride, padding, dilation):
    """out = the adjoint of _taps: each element of cols (C, R, S, N, P, Q)
    added to the input element it was copied from (padding dropped).  Also
    average pooling's backward (its cols a broadcast view)."""
    (ph, pw), (sh, sw), (dh, dw) = padding, stride, dilation
    c, r_, s_, n, p, q = cols.shape
    h, w = out.shape[2:]
    acc = np.zeros((c, n, h + 2 * ph, w + 2 * pw), out.dtype)
    for i in range(r_):
        for j in range(s_):
            acc[:, :, i * dh:i * dh + sh * (p - 1) + 1:sh,
                j * dw:j * dw + sw * (q - 1) + 1:sw] += cols[:, i, j]
    np.copyto(out, acc[:, :, ph:ph + h, pw:pw + w].transpose(1, 0, 2, 3))


def _windows(x, kernel, out_hw, stride, padding, dilation, fill):
    """The (N, C, P, Q, R, S) view of x's windows, padded with ``fill``:
    element [n, c, p, q, r, s] is x[n, c, p*sh - ph + r*dh, q*sw - pw + s*dw]."""
    (ph, pw), (sh, sw), (dh, dw) = padding, stride, dilation
    r, s = kernel
    p, q = out_hw
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    span = (dh * (r - 1) + 1, dw * (s - 1) + 1)
    v = np.lib.stride_tricks.sliding_window_view(x, span, axis=(2, 3))
    return v[:, :, :sh * (p - 1) + 1:sh, :sw * (q - 1) + 1:sw, ::dh, ::dw]


def _pool_counts(in_hw, out_hw, window, stride, padding):
    """(P, Q): the number of input elements in each window (padding excluded)."""
    counts = []
    for n, m, k, st, pad in zip(in_hw, out_hw, window, stride, padding):
        start = np.arange(m) * st - pad
        counts.append(np.minimum(start + k, n) - np.maximum(start, 0))
    return np.multiply.outer(counts[0], counts[1])


def _maxpool(x, out, argmax, window, stride, padding):
    """Max over each window (padding is -inf), NaN winning, and the index
    r * window_w + s within the window of the first maximum in row-major order
    (the first NaN)."""
    win = _windows(x, window, out.shape[2:], stride, padding, (1, 1), -np.inf)
    p, q = out.shape[2:]
    (wh, ww), (sh, sw), (ph, pw) = window, stride, padding
    h, w = x.shape[2:]
    rows = np.arange(p)[:, None] * sh - ph + np.arange(wh)           # (P, wh)
    cols = np.arange(q)[:, None] * sw - pw + np.arange(ww)           # (Q, ww)
    flat = win.reshape(win.shape[:4] + (-1,))
    # numpy's argmax is the first maximum, or the first NaN: our semantics,
    # unless a window's maximum is -inf and its first -inf is padding.
    first = np.argmax(flat, axis=-1)
    np.copyto(out, np.take_along_axis(flat, first[..., None], axis=-1)[..., 0])
    r, s = np.divmod(first, ww)
    hh, wc = rows[np.arange(p)[:, None], r], cols[np.arange(q)[None, :], s]
    if not (ph or pw) or ((hh >= 0) & (hh < h) & (wc >= 0) & (wc < w)).all():
        np.copyto(argmax, first)
        return
    # The first element of each window that equals the maximum (or is NaN
    # where the maximum is), among the elements inside x.
    inside = (((rows >= 0) & (rows < h))[:, None, :, None]
              & ((cols >= 0) & (cols < w))[None, :, None, :])        # (P, Q, wh, ww)
    best = out[:, :, :, :, None, None]
    hit = (win == best) | (np.isnan(win) & np.isnan(best))
    hit &= inside
    np.copyto(argmax, np.argmax(hit.reshape(hit.shape[:4] + (-1,)), axis=-1))   # first True


def _maxpool_backward(argmax, dy, dx, window, stride, padding):
    """dx[h, w] = the sum of dy over the windows whose argmax names (h, w);
    an argmax that names no element of x in its window (not a whole number
    in [0, window size), or a padding position) adds nothing."""
    n, c, h, w = dx.shape
    p, q = dy.shape[2:]
    (wh, ww), (sh, sw), (ph, pw) = window, stride, padding
    ok = np.isfinite(argmax) & (argmax >= 0) & (argmax < wh * ww) & (argmax == np.trunc(argmax))
    r, s = np.divmod(np.where(ok, argmax, 0).astype(np.intp), ww)
    r = r + (np.arange(p) * sh - ph)[:, None]     # the element's row and column in x
    s = s + (np.arange(q) * sw - pw)[None, :]
    ok &= (r >= 0) & (r < h) & (s >= 0) & (s < w)
    idx = np.where(ok, r * w + s, 0)
    planes = np.arange(n * c).reshape(n, c, 1, 1) * (h * w)
    # bincount adds in index order: deterministic
    total = np.bincount((planes + idx)[ok], weights=dy[ok], minlength=n * c * h * w)
    np.copyto(dx, total.reshape(dx.shape))


def _row_ids(op, idx, vocab):
    """The rows ``idx`` names, as ints; raises ValueError, before the op
    writes anything, for the first index not in [0, vocab) (NaN included)."""
    v = idx.reshape(-1)
    bad = ~((v >= 0) & (v < vocab))      # NaN compares False: bad
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        fail_value(op, f"idx[{i}] = {v[i]!r} is not a row index of a table of {vocab} "
                       f"rows (valid: [0, {vocab}))")
    return v.astype(np.intp)                 # truncates towards zero


def _kept(shape, axis):
    """``shape`` with 1 at ``axis`` (an int or a tuple of ints)."""
    axes = axis if type(axis) is tuple else (axis,)
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _widened(hook):
    """``hook`` for every dtype, with NumPy's floating-point warnings off (the
    work hooks' helpers rely on it).  On a half-format handler it runs on the
    float32 twin (``_wide``) over float32 copies of the half arrays, and each
    copy that the hook changed is rounded back once into its array.  Copies
    are made once per array object, so an array passed twice (an output that
    is an input) is one copy; an input that is an output's memory through
    another object is unchanged, so it is never written back over the
    result."""
    def run(self, *args):
        # NaN, inf and division by zero are results, as on the GPU, never
        # NumPy warnings: every op runs with them off (this one place).
        with np.errstate(all="ignore"):
            return widened(self, *args)

    def widened(self, *args):
        wide = self._wide
        if wide is None:
            return hook(self, *args)
        dt, copies = self.dtype, {}

        def widen(a):
            if type(a) is np.ndarray and a.dtype == dt:
                if id(a) not in copies:
                    copies[id(a)] = (a, a.astype(np.float32))
                return copies[id(a)][1]
            return a
        result = hook(wide, *[widen(a) for a in args])
        for a, c in copies.values():
            new = c.astype(dt)   # beyond the format's range: inf, as on store
            if not np.array_equal(new.view(np.uint16), a.view(np.uint16)):
                np.copyto(a, new)
        return result
    run.__name__, run.__qualname__, run.__doc__ = hook.__name__, hook.__qualname__, hook.__doc__
    return run


for _name in WORK_HOOKS:
    setattr(NumpyHandler, _name, _widened(getattr(NumpyHandler, _name)))
