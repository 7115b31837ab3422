"""Loss layers: ``SoftmaxCrossEntropy`` and ``SquaredError``.

A loss's ``forward(y, targets)`` returns the loss as a 1-element handler
array, averaged over the samples of the batch, and ``backward()`` returns
dL/dy.  The value stays on the device: reading it is a host round trip, which
the trainer does only every few steps.
"""
import math

from .base import Layer


class Loss(Layer):
    """Base of the losses: a layer whose ``forward`` also takes targets and
    returns the scalar loss (shape (1,)); ``backward()`` takes no argument."""

    def forward(self, y, targets, training=True):
        """Return the mean loss of the batch as a (1,) handler array."""
        raise NotImplementedError

    def backward(self, dy=None):
        """Return dL/dy for the ``y`` of the last ``forward``."""
        raise NotImplementedError


class SoftmaxCrossEntropy(Loss):
    """Softmax over the classes (columns) of ``y`` (n, c) followed by the mean
    cross-entropy -1/n sum_i log p[i, target_i].

    ``targets`` are either class indices stored as floats, shape (n, 1), or a
    distribution per row (one-hot or soft), shape (n, c).  The gradient is
    (softmax(y) - onehot) / n.  ``probabilities`` holds softmax(y) after
    ``forward``.

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
        h = self.h
        b = self.buffers(y.shape, p=(n, c), work=(n, c), col=(n, 1), loss=(1,))
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
        return b.loss

    def backward(self, dy=None):
        h, b, t = self.h, self._b, self._targets
        n, c = b.p.shape
        if t.shape == (n, 1) and c != 1:
            h.binarize_v(t, b.work)                   # one-hot of the class indices
            h.subtract_tt(b.p, b.work, b.work)
        else:
            h.subtract_tt(b.p, t, b.work)
        h.mult_st(1.0 / n, b.work, b.work)
        return b.work


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
        h.subtract_tt(y, targets, b.diff)
        h.mult_tt(b.diff, b.diff, b.work)
        h.sum_t(b.work, None, b.loss)
        h.mult_st(0.5 / self._n, b.loss, b.loss)
        self._b = b
        return b.loss

    def backward(self, dy=None):
        b = self._b
        self.h.mult_st(1.0 / self._n, b.diff, b.work)
        return b.work
