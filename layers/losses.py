"""Loss layers: ``SoftmaxCrossEntropy`` and ``SquaredError``.

A loss's ``forward(y, targets)`` returns the loss as a 1-element handler
array, averaged over the samples of the batch, and ``backward()`` returns
dL/dy.  The value stays on the device: reading it is a host round trip, which
the trainer does only every few steps.

A loss bound to a half-format handler (float16, bfloat16) computes in float32:
its ``h`` is the float32 twin (``Handler.twin``), ``y`` is cast into it (exact),
the loss and dL/dy are rounded once back into ``y``'s format, and the targets
are float32 arrays of ``h``.  Class labels above all: a half format holds
whole numbers exactly only up to 256 (bfloat16) or 2048 (float16), so labels
held there would name other classes; float32 holds them up to 2^24.
"""
import math

from handlers import dtypes

from .base import Layer


class Loss(Layer):
    """Base of the losses: a layer whose ``forward`` also takes targets and
    returns the scalar loss (shape (1,)); ``backward()`` takes no argument.

    ``bind(h)`` makes ``self.h`` the handler the loss computes in: ``h`` for
    float32 and float64, its float32 twin for a half format (see the module
    docstring).  ``y`` may be of any format of ``h``'s family, and the loss
    and dL/dy come back in ``y``'s format; targets should be arrays of
    ``self.h`` (of another format they are cast into it first)."""

    def bind(self, h):
        """Compute on ``h``, or for a half format on its float32 twin."""
        super().bind(h.twin(dtypes.compute_dtype(h.dtype)))

    def forward(self, y, targets, training=True):
        """Return the mean loss of the batch as a (1,) array of ``y``'s format."""
        raise NotImplementedError

    def backward(self, dy=None):
        """Return dL/dy for the ``y`` of the last ``forward``, in ``y``'s format."""
        raise NotImplementedError

    def own(self, name, a):
        """``a`` as an array of ``self.h``: itself, or cast into a buffer kept
        for its shape and format (``name`` tells buffers apart)."""
        if a.dtype == self.h.dtype:
            return a
        buf = self.cached((name, tuple(a.shape), a.dtype.name),
                          lambda: self.h.allocate(tuple(a.shape)))
        self.h.cast_t(a, buf)
        return buf

    def in_format_of(self, name, a, y):
        """``a`` (an array of ``self.h``) in the format of ``y``: itself, or
        cast (rounded once) into a buffer of ``y``'s format kept for its
        shape and format (``name`` tells buffers apart)."""
        if a.dtype == y.dtype:
            return a

        def build():
            hy = self.h.twin(y.dtype)
            return hy, hy.allocate(tuple(a.shape))
        hy, out = self.cached((name, tuple(a.shape), y.dtype.name), build)
        hy.cast_t(a, out)
        return out


class SoftmaxCrossEntropy(Loss):
    """Softmax over the classes (columns) of ``y`` (n, c) followed by the mean
    cross-entropy -1/n sum_i log p[i, target_i].

    ``targets`` are either class indices stored as floats, shape (n, 1), or a
    distribution per row (one-hot or soft), shape (n, c).  The gradient is
    (softmax(y) - onehot) / n.  ``probabilities`` holds softmax(y) after
    ``forward`` (an array of ``self.h``).

    Class indices must be exact in the format they come in and in
    ``self.h``'s, where they are read: ValueError, before any work, where c
    classes need an index beyond the whole numbers either holds (half-format
    labels for more than 257 or 2049 classes; float32 for more than
    2^24 + 1).  Give them as arrays of ``self.h``, float32 for a network in
    a half format.

    The log-probabilities are computed as (y - rowmax) - log(sum(exp(y -
    rowmax))), never as log(softmax(y)): a probability that underflows to 0
    (logits [0, -800]) still gives its exact, finite log (-800).
    """

    def forward(self, y, targets, training=True):
        self.check_input(y, 2, what="y")
        n, c = y.shape
        if targets.shape not in ((n, 1), (n, c)):
            raise ValueError(f"SoftmaxCrossEntropy: targets must be ({n}, 1) class indices "
                             f"or ({n}, {c}) distributions, got {targets.shape}")
        if targets.shape == (n, 1) and c != 1:
            self._check_labels(targets.dtype, c)
        h = self.h
        b = self.buffers(y.shape, p=(n, c), work=(n, c), col=(n, 1), loss=(1,))
        self._y, targets = y, self.own("targets", targets)
        if y.dtype != h.dtype:
            h.cast_t(y, b.p)       # the logits in float32: p is written after their last read
            y = b.p
        h.max_t(y, 1, b.col)                          # row maxima
        h.subtract_mv(y, b.col, b.work)               # shifted logits s <= 0
        h.exp_t(b.work, b.p)
        h.sum_t(b.p, 1, b.col)                        # sum(exp(s)) in [1, c]
        h.divide_mv(b.p, b.col, b.p)                  # softmax
        h.log_t(b.col, b.col)
        h.subtract_mv(b.work, b.col, b.work)          # log softmax, finite for finite y
        if targets.shape == (n, 1) and c != 1:
            h.index_m_by_v(b.work, targets, b.col)    # log p of each row's class
            h.sum_t(b.col, None, b.loss)
        else:
            h.mult_tt(targets, b.work, b.work)
            h.sum_t(b.work, None, b.loss)
        h.mult_st(-1.0 / n, b.loss, b.loss)
        self._targets, self._b = targets, b
        self.probabilities = b.p
        return self.in_format_of("loss", b.loss, self._y)

    def backward(self, dy=None):
        h, b, t = self.h, self._b, self._targets
        n, c = b.p.shape
        if t.shape == (n, 1) and c != 1:
            h.binarize_v(t, b.work)                   # one-hot of the class indices
            h.subtract_tt(b.p, b.work, b.work)
        else:
            h.subtract_tt(b.p, t, b.work)
        h.mult_st(1.0 / n, b.work, b.work)
        return self.in_format_of("dy", b.work, self._y)

    def _check_labels(self, dtype, c):
        """ValueError unless class indices 0 .. c-1 are all exact in ``dtype``,
        the labels' format, and in ``self.h``'s, where the ops read them."""
        ours = dtypes.exact_integers(self.h.dtype)
        for dt in (dtype, self.h.dtype):
            limit = dtypes.exact_integers(dt)
            if c - 1 > limit:
                hint = (f"; give them as {self.h.dtype} arrays of the loss's handler (loss.h)"
                        if c - 1 <= ours else "")
                raise ValueError(f"SoftmaxCrossEntropy: y has {c} classes, but {dt} holds "
                                 f"whole numbers exactly only up to {limit}, so some class "
                                 f"indices would name other classes{hint}")


class SquaredError(Loss):
    """0.5 * sum((y - t)^2) / n, where n counts the samples: every axis but the
    last is a sample axis (n = y.size / y.shape[-1]).  Gradient (y - t) / n."""

    def forward(self, y, targets, training=True):
        if targets.shape != y.shape:
            raise ValueError(f"SquaredError: targets shape {targets.shape} differs "
                             f"from y shape {y.shape}")
        h = self.h
        b = self.buffers(y.shape, diff=y.shape, work=y.shape, loss=(1,))
        self._n = math.prod(y.shape[:-1]) if len(y.shape) > 1 else 1
        self._y, targets = y, self.own("targets", targets)
        if y.dtype != h.dtype:
            h.cast_t(y, b.work)    # y in float32: work is written after its last read
            y = b.work
        h.subtract_tt(y, targets, b.diff)
        h.mult_tt(b.diff, b.diff, b.work)
        h.sum_t(b.work, None, b.loss)
        h.mult_st(0.5 / self._n, b.loss, b.loss)
        self._b = b
        return self.in_format_of("loss", b.loss, self._y)

    def backward(self, dy=None):
        b = self._b
        self.h.mult_st(1.0 / self._n, b.diff, b.work)
        return self.in_format_of("dy", b.work, self._y)
