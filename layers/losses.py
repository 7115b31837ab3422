"""Loss layers: ``SoftmaxCrossEntropy`` and ``SquaredError``.

A loss's ``forward(y, targets)`` returns the loss as a 1-element handler
array, averaged over the samples of the batch, and ``backward()`` returns
dL/dy.  The value stays on the device: reading it is a host round trip, which
the trainer does only every few steps.

A loss bound to a half-format handler (float16, bfloat16) computes in float32:
its ``h`` is the float32 twin (``Handler.twin``), ``y`` is widened into it
(exact: a ``cast_t``, or in ``SoftmaxCrossEntropy``'s fused program as it is
loaded), the loss and dL/dy are rounded once back into ``y``'s format, and the targets
are float32 arrays of ``h``.  Class labels above all: a half format holds
whole numbers exactly only up to 256 (bfloat16) or 2048 (float16), so labels
held there would name other classes; float32 holds them up to 2^24.
"""
import math

from handlers import dtypes, fused_op

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


def _cross_entropy(targets, gradient):
    """The fused program of softmax cross-entropy for ``targets`` "labels"
    (class indices, (n, 1)) or "distributions" ((n, c)): each row's loss
    times ``inv_n`` into ``loss`` (n, 1) and, with ``gradient``, dL/dy into
    ``dy``.  One pass over the logits: the row's max, its sum of exponentials
    and the outputs come from registers on the GPU where the row fits."""
    # Each reduction of y alone is taken beside the max (the first level of
    # reductions, one pass over the row), so that only the sum of the
    # exponentials waits on the max: on an H200 the labels' picked logit
    # summed after the max (where(hit, y - m, 0)) cost 24 us of 119 over
    # 8192x4096 (benchmarks/results/diagnostics/fused_terms-NVIDIA-H200.log).
    if targets == "labels":
        # The class of t as index_m_by_v takes it: t truncated toward zero,
        # valid in [0, c) (c = classes); no column matches an invalid one
        # (NaN included), and sqrt(-1) then makes that row's loss NaN.  The
        # picked logit is a sum of zeros and y[t] alone: exact.
        first = "hit = col <= t and t < col + 1\npicked = sum(where(hit, y, 0))\n"
        loss = ("loss = (log(s) - (picked - m) + sqrt(where(0 <= t and t < classes, 0, -1)))"
                " * inv_n\n")
        grad = "dy = e * q - where(hit, inv_n, 0)\n"
        t = "t:col"
    else:   # -sum(t * log p), log p = (y - m) - log(s), finite for finite y
        first = "mass = sum(t)\n"
        loss = "loss = (log(s) * mass - sum(t * (y - m))) * inv_n\n"
        grad = "dy = e * q - t * inv_n\n"
        t = "t"
    body = "m = max(y)\n" + first + "e = exp(y - m)\ns = sum(e)\n" + loss
    # dL/dy = (e / s - target) * inv_n, with one division a row (q), not one
    # an element: on an H200 the labels program over 8192x4096 took 85.5 us
    # so, 98.9 dividing each element (diagnostics/fused_terms).
    body += "q = inv_n / s\n" + grad if gradient else ""
    # The logits and dL/dy in any format (a half network's), the rest in the
    # loss's float32: the logits widened as they are loaded, dL/dy rounded
    # once as it is stored, in the same pass.
    return fused_op(f"softmax_cross_entropy_{targets}{'_grad' if gradient else ''}",
                    inputs=f"y^ {t} #inv_n" + (" #classes" if targets == "labels" else ""),
                    outputs="loss:col dy^" if gradient else "loss:col",
                    body=body)


#: (targets, with the gradient) -> its fused program
_CROSS_ENTROPY = {(t, g): _cross_entropy(t, g)
                  for t in ("labels", "distributions") for g in (False, True)}


class SoftmaxCrossEntropy(Loss):
    """Softmax over the classes (columns) of ``y`` (n, c) followed by the mean
    cross-entropy -1/n sum_i log p[i, target_i].

    ``targets`` are either class indices stored as floats, shape (n, 1), or a
    distribution per row (one-hot or soft), shape (n, c), or the class
    indices of sequences, (B, T) for the n = B * T rows of a sequence
    model's outputs (a GPT's next tokens; read as (n, 1)).  The gradient is
    (softmax(y) - onehot) / n.  A class index is taken as ``index_m_by_v``
    takes it (truncated toward zero); one that names no class gives a NaN
    loss.  ``probabilities`` computes softmax(y) of the last ``forward``
    when read (an array of ``self.h``).

    ``forward`` is one fused kernel on a GPU (``handlers.fused``), which
    reads the logits once and, while training, writes dL/dy in the same pass
    (``backward`` then returns it; after ``training=False`` it computes it
    then), plus the sum of the rows' losses.  Logits of a half format are
    read as they are (widened to float32 as they are loaded) and dL/dy is
    written in their format, rounded once: no cast either way.

    Class indices must be exact in the format they come in and in
    ``self.h``'s, where they are read: ValueError, before any work, where c
    classes need an index beyond the whole numbers either holds (half-format
    labels for more than 257 or 2049 classes; float32 for more than
    2^24 + 1).  Give them as arrays of ``self.h``, float32 for a network in
    a half format.

    The log-probabilities are taken as (y - rowmax) - log(sum(exp(y -
    rowmax))), never as log(softmax(y)): a probability that underflows to 0
    (logits [0, -800]) still gives its exact, finite log (-800).
    """

    _trained = None   # no forward yet

    def forward(self, y, targets, training=True):
        self.check_input(y, 2, what="y")
        n, c = y.shape
        if len(targets.shape) == 2 and targets.shape not in ((n, 1), (n, c)) \
                and targets.shape[0] * targets.shape[1] == n:
            targets = self.reshaped("sequences", targets, (n, 1))   # (B, T) indices
        if targets.shape not in ((n, 1), (n, c)):
            raise ValueError(f"SoftmaxCrossEntropy: targets must be ({n}, 1) class indices, "
                             f"({n}, {c}) distributions or (B, T) indices of sequences with "
                             f"B * T = {n}, got {targets.shape}")
        labels = targets.shape == (n, 1) and c != 1
        if labels:
            self._check_labels(targets.dtype, c)
        b = self.buffers(y.shape, rows=(n, 1), loss=(1,))
        self._y, targets = y, self.own("targets", targets)
        # dL/dy in y's format (the program rounds it once as it stores it)
        self._dy = self.cached(("dy", y.shape, y.dtype.name),
                               lambda: self.h.twin(y.dtype).allocate(y.shape))
        self._logits, self._targets, self._b = y, targets, b
        self._labels = "labels" if labels else "distributions"
        self._run(training)
        self.h.sum_t(b.rows, None, b.loss)
        return self.in_format_of("loss", b.loss, self._y)

    def _run(self, gradient):
        """The fused program on the last forward's logits and targets: each
        row's loss into ``rows`` and, with ``gradient``, dL/dy into ``dy``."""
        b, y, t = self._b, self._logits, self._targets
        program = _CROSS_ENTROPY[(self._labels, bool(gradient))]
        n, c = y.shape
        classes = (float(c),) if self._labels == "labels" else ()
        self.run_fused((self._labels, bool(gradient), y.shape), program, y, t, 1.0 / n,
                       *classes, b.rows, *((self._dy,) if gradient else ()))
        self._trained = bool(gradient)

    @property
    def probabilities(self):
        """softmax(y) of the last ``forward``, computed now (an array of
        ``self.h``, the same array at each read for a shape)."""
        if self._trained is None:
            raise RuntimeError("SoftmaxCrossEntropy.probabilities: no forward yet")
        shape = self._logits.shape
        p = self.cached(("p", shape), lambda: self.h.allocate(shape))
        self.h.softmax_m(self.own("logits", self._logits), p)
        return p

    def backward(self, dy=None):
        if self._trained is None:
            raise RuntimeError("SoftmaxCrossEntropy.backward: no forward yet")
        if not self._trained:   # the forward computed no gradient (training=False)
            self._run(True)
        return self._dy

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
