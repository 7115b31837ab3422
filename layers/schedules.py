"""Learning-rate schedules and clipping by the global gradient norm.

A schedule is a callable of the step count (0 for the first step) giving
the learning rate; assign it to the optimizer before each step::

    sched = WarmupCosine(3e-4, warmup=100, total=2000)
    for step in range(2000):
        opt.lr = sched(step)          # a device scalar: a captured step sees it
        net.train_step(x, t)
        clip_grad_norm(net.parameters, 1.0)
        opt.step()

The optimizers keep ``lr`` on the device (``SGD``, ``Adam``), so a step
captured once (``Handler.capture``) reads each new value on its replay.
``clip_grad_norm`` runs on the device too: the norm, the factor and the
scaling are four ops with no host read, so it belongs inside a captured
step.
"""
import math

from handlers import fused_op

from .params import ParameterSet, view


class WarmupCosine:
    """lr(step): from 0 up to ``lr`` in a straight line over the first
    ``warmup`` steps, then down to ``min_lr`` along half a cosine by step
    ``total``, and ``min_lr`` after."""

    def __init__(self, lr, warmup, total, min_lr=0.0):
        for name, v in (("lr", lr), ("min_lr", min_lr)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ValueError(f"WarmupCosine: {name} must be a finite number >= 0, got {v!r}")
        if not (isinstance(warmup, int) and isinstance(total, int) and 0 <= warmup < total):
            raise ValueError(f"WarmupCosine: warmup and total must be ints with "
                             f"0 <= warmup < total, got {warmup!r}, {total!r}")
        self.lr, self.min_lr, self.warmup, self.total = float(lr), float(min_lr), warmup, total

    def __repr__(self):
        return (f"WarmupCosine({self.lr:g}, warmup={self.warmup}, total={self.total}, "
                f"min_lr={self.min_lr:g})")

    def __call__(self, step):
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if step >= self.total:
            return self.min_lr
        done = (step - self.warmup) / (self.total - self.warmup)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * done))


#: each row's sum of squares
_SQUARES = fused_op("grad_row_squares", inputs="g", outputs="s:col", body="s = sum(g * g)")
#: the norm, and the factor that brings it down to max_norm (1 when below)
_FACTOR = fused_op("grad_clip_factor", inputs="total #max_norm", outputs="norm factor",
                   body="norm = sqrt(total)\nfactor = min(1, max_norm / (norm + 1e-6))")
#: g *= factor, the factor a device scalar
_SCALE = fused_op("grad_scale", inputs="g $factor", outputs="out", body="out = g * factor")


def check_max_norm(owner, name, value):
    """``value`` if a finite number > 0, else ValueError naming ``owner``
    and the argument ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value < math.inf:
        raise ValueError(f"{owner}: {name} must be a finite number > 0, got {value!r}")
    return value


def clip_grad_norm(parameters, max_norm, grads=None):
    """Scale the gradients so that their global L2 norm (over every
    parameter) is at most ``max_norm``, on the device with no host read;
    returns a (1,) device array holding the norm before clipping.

    ``parameters`` is a ``ParameterSet`` (``net.parameters``); ``grads``
    the flat gradients to clip, by default its own (``net.grads``; under
    mixed precision with half gradients, pass ``net.compute[1]``).  The
    alignment padding between parameters holds zeros, so it adds nothing.
    Four small ops: row sums of squares, their total, the factor, the
    scaling."""
    if not isinstance(parameters, ParameterSet):
        raise TypeError(f"clip_grad_norm: parameters must be a ParameterSet, got "
                        f"{type(parameters).__name__}")
    check_max_norm("clip_grad_norm", "max_norm", max_norm)
    g = parameters.grads if grads is None else grads
    h = parameters.h if grads is None else _owner(parameters, grads)
    state = parameters.__dict__.setdefault("_clip", {})
    key = (id(g), h.dtype)
    found = state.get(key)
    if found is None:
        n = g.shape[0]
        cols = next(c for c in (1024, 256, 64, 1) if n % c == 0)
        found = state[key] = (view(h, g, 0, (n // cols, cols)), h.allocate((n // cols, 1)),
                              h.allocate((1,)), h.allocate((1,)), h.allocate((1,)))
    rows, squares, total, norm, factor = found
    _SQUARES(h, rows, squares)
    h.sum_t(squares, None, total)
    _FACTOR(h, total, float(max_norm), norm, factor)
    _SCALE(h, g, factor, g)
    return norm


def _owner(parameters, grads):
    """The handler of ``grads``: the set's own, or under mixed precision the
    compute twin holding the half copy."""
    h = parameters.h
    return h if grads.dtype == h.dtype else h.twin(grads.dtype)
