"""NumpyHandler: the Handler contract on the CPU with NumPy.

Every op writes into its output with ``out=``.  Where an op needs an
intermediate (``dot_add_mm``, ``mult_add_tt``, some derivatives), it uses a
scratch array cached per shape instead of allocating on every call.  Ops run at
once, which is a valid schedule for every stream group, so events are complete
when they are recorded.
"""
import numpy as np

from .base import Handler
from .checks import fail_type
from .prefetch import Transfer


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


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


class NumpyHandler(Handler):
    """Handler whose arrays are C-contiguous ``numpy.ndarray`` of ``dtype``."""

    array_type = np.ndarray

    def __init__(self, dtype=np.float32, seed=None, num_stream_groups=4):
        super().__init__(dtype, seed, num_stream_groups)
        self._rng = np.random.default_rng(seed)
        self._scratch_cache = {}

    def _scratch(self, shape):
        # One cached buffer per shape; ops run to completion before returning,
        # so one buffer per shape is never used by two ops at once.
        buf = self._scratch_cache.get(shape)
        if buf is None:
            buf = self._scratch_cache[shape] = np.empty(shape, self.dtype)
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

    def _same_memory(self, a, b):
        return a is b or (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
                          and a.nbytes == b.nbytes)

    # BLAS ------------------------------------------------------------------
    def _dot(self, a, b, out, transa, transb, beta):
        a = a.T if transa else a
        b = b.T if transb else b
        if beta == 0.0:
            np.dot(a, b, out=out)
        else:
            self._add_product(np.dot, a, b, out)

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

    # reduction --------------------------------------------------------------
    def _sum_t(self, a, axis, out):
        if axis is None:
            np.sum(a, axis=None, out=out.reshape((1,) * a.ndim), keepdims=True)
        else:
            np.sum(a, axis=axis, out=out.reshape(_kept(a.shape, axis)), keepdims=True)

    def _transpose_m(self, a, out):
        np.copyto(out, a.T)

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

    def _broadcast_t(self, a, axis, out):
        np.copyto(out, a)

    def _mv(self, name, m, v, out, orientation):
        with np.errstate(divide="ignore", invalid="ignore"):
            _BINARY[name](m, v, out=out)

    # rows -----------------------------------------------------------------
    def _softmax_m(self, m, out):
        col = self._scratch((m.shape[0], 1))
        np.max(m, axis=1, keepdims=True, out=col)
        np.subtract(m, col, out=out)
        np.exp(out, out=out)
        np.sum(out, axis=1, keepdims=True, out=col)
        np.divide(out, col, out=out)

    # indexing and masks -----------------------------------------------------
    def _valid_index(self, v, n):
        idx = v[:, 0]
        with np.errstate(invalid="ignore"):
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

    def _is_fully_finite(self, a):
        return np.isfinite(a).all()

    # randomness -------------------------------------------------------------
    def _fill_gaussian(self, mean, std, out):
        self._rng.standard_normal(out=out, dtype=self.dtype)
        np.multiply(out, std, out=out)
        np.add(out, mean, out=out)

    def _probability_mask(self, mask, p):
        self._rng.random(out=mask, dtype=self.dtype)
        np.less(mask, p, out=mask)


def _kept(shape, axis):
    """``shape`` with 1 at ``axis`` (an int or a tuple of ints)."""
    axes = axis if type(axis) is tuple else (axis,)
    return tuple(1 if i in axes else d for i, d in enumerate(shape))
