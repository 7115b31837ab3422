"""Optimizers on the flat buffers: ``SGD`` with momentum, ``Adam`` and ``AdamW``.

Every hyperparameter is checked before anything is written, at construction
and by each setter (a schedule's new ``lr``): a wrong type raises TypeError,
a value out of range, NaN or infinite ValueError, naming the optimizer, the
hyperparameter and the value.  The device scalars the steps read are filled
only from checked values, so a NaN rate never reaches the parameters.
"""
import math

import numpy as np

from handlers import dtypes, fused_op
from handlers.checks import check_scalar
from handlers.optable import check_adam_hyperparameters

from . import interrupts
from .base import run_bound
from .checkpoint import ArrayChecker, NoCopies
from .params import ParameterSet, view


def _parameter_set(owner, parameters):
    """``parameters`` if it is a ``ParameterSet``, else TypeError naming ``owner``."""
    if not isinstance(parameters, ParameterSet):
        raise TypeError(f"{owner}: parameters must be a ParameterSet (net.parameters), "
                        f"got {type(parameters).__name__}")
    return parameters


def _rate(owner, value):
    """A learning rate: a real number, finite and >= 0 (NaN fails), as a float."""
    lr = check_scalar(owner, "lr", value)
    if not 0.0 <= lr < math.inf:
        raise ValueError(f"{owner}: lr must be finite and >= 0, got {value!r}")
    return lr


def _check_kind(checker, name):
    """ValueError unless the state is of the optimizer class ``name``."""
    kind = checker.value("optimizer", str)
    if kind != name:
        raise ValueError(f"{checker.owner}: the state is of {kind}, not {name}")


#: One SGD step over the flat buffers, read and written once:
#: v = beta * v + alpha * g, then p = p + gate * v (alpha = -lr, beta =
#: momentum and gate = 1 for the plain step; a loss scaler's gated values
#: otherwise), all three device scalars, so a captured step sees new values.
#: g may be of another format than p (``^``): a mixed-precision network's
#: half gradients, widened as they are read (``SGD.step(grads=...)``).
_SGD_STEP = fused_op("sgd_momentum_step", inputs="g^ $alpha $beta $gate", outputs="v p",
                     body="""
v = beta * v + alpha * g
p = p + gate * v
""")
#: The same step that also writes the new parameters into ``w``, of any
#: format: a mixed-precision network's working copy, rounded once, in the
#: same pass (``SGD.step(working=...)``), which spares the next forward pass
#: its cast of the master parameters.
_SGD_STEP_WORKING = fused_op("sgd_momentum_step_working", inputs="g^ $alpha $beta $gate",
                             outputs="v p w^", body="""
v = beta * v + alpha * g
p = p + gate * v
w = p
""")


def _momentum(value):
    m = check_scalar("SGD", "momentum", value)
    if not 0.0 <= m < 1.0:   # NaN fails too
        raise ValueError(f"SGD: momentum must be in [0, 1), got {value!r}")
    return m


class SGD(NoCopies):
    """SGD with momentum over a whole ``ParameterSet``:

        v = momentum * v - lr * g
        p = p + v

    A step is one fused op over the flat buffers (one kernel on a GPU, which
    reads g, v and p once and writes v and p once), whatever the number of
    layers, with no host round trip.  ``lr`` and ``momentum`` may be changed
    between steps (schedules): they live on the device as the op's device
    scalars, so a step captured as a graph
    (``Handler.capture``) sees the new values on its next replay.  Setting
    one queues a one-element fill on group 0; do it outside a capture.

    Args:
        parameters: a ``ParameterSet`` (``net.parameters``).
        lr: learning rate, a finite number >= 0.
        momentum: in [0, 1).

    Raises TypeError for a non-number (or parameters that are not a
    ``ParameterSet``) and ValueError for a value out of range, NaN or
    infinite, before anything is allocated or written; the setters too.
    """

    #: ``step`` takes ``grads`` of another format (``Trainer`` asks)
    takes_grads = True

    def __init__(self, parameters, lr=0.1, momentum=0.9):
        self.parameters = _parameter_set("SGD", parameters)
        lr, momentum = _rate("SGD", lr), _momentum(momentum)
        h = parameters.h
        # The device scalars: -lr, momentum, 1.  Times a gate, plus (0, 1 -
        # gate, 0), they are a gated step's (step(gate=...)).
        self._scalars = h.create_from_numpy(np.array([0.0, 0.0, 1.0]))
        self._neg_lr, self._momentum, self._one = (view(h, self._scalars, i, (1,))
                                                    for i in range(3))
        self._unit = h.create_from_numpy(np.array([0.0, 1.0, 0.0]))
        self._gated = h.zeros((3,))
        self._gated_views = [view(h, self._gated, i, (1,)) for i in range(3)]
        self.lr = lr
        self.momentum = momentum
        self.velocity = h.zeros(parameters.params.shape)
        self._bound = {}   # the step's bound calls (layers.base.run_bound)

    @property
    def lr(self):
        """The learning rate, finite and >= 0 (checked when set)."""
        return self._lr

    @lr.setter
    def lr(self, value):
        lr = _rate("SGD", value)   # checked before the device scalar is filled
        self.parameters.h.fill(self._neg_lr, -lr)
        self._lr = lr

    @property
    def momentum(self):
        """The momentum, in [0, 1)."""
        return self._mom

    @momentum.setter
    def momentum(self, value):
        momentum = _momentum(value)
        self.parameters.h.fill(self._momentum, momentum)
        self._mom = momentum

    # ------------------------------------------------------------------ state
    def state_dict(self):
        """``{"optimizer": "SGD", "lr": ..., "momentum": ...}`` and the
        velocity of each parameter, ``"velocity.<parameter name>"`` (a host
        read: waits for the device)."""
        p = self.parameters
        return {"optimizer": "SGD", "lr": self.lr, "momentum": self.momentum,
                **p.split(p.h.get_numpy_copy(self.velocity), "velocity.")}

    def loader(self, state, cast=False):
        """Check ``state`` (a ``state_dict()`` of an SGD over the same
        parameters) and return the function that writes it; ValueError
        naming the first mismatch, before anything is written."""
        c = ArrayChecker("SGD.load_state_dict", state, cast)
        _check_kind(c, "SGD")
        lr = _rate("SGD", c.value("lr", (int, float)))
        momentum = _momentum(c.value("momentum", (int, float)))
        velocity = self.parameters.join(c, "velocity.")
        c.done()

        def write():
            self.lr, self.momentum = lr, momentum
            self.parameters.h.set_from_numpy(self.velocity, velocity)
        return write

    def load_state_dict(self, state, cast=False):
        """Restore ``lr``, ``momentum`` and the velocity from ``state``
        (see ``loader``); nothing is written unless all of it fits."""
        self.loader(state, cast)()

    def step(self, gate=None, grads=None, working=None):
        """Update every parameter from the gradients of the last backward.

        ``gate`` (a one-element array of the handler, e.g. a
        ``LossScaler``'s flag): where it holds 0 the step changes nothing
        (the gradients must be finite: ``scale_finite_t`` sees to it), where
        1 it is the plain step, decided on the device.  Three more small ops
        make the gated scalars -lr * gate, (1 - gate) + gate * momentum and
        gate, each exact for a gate of 0 or 1, for the same one-op step.  A
        Ctrl-C during the step is raised after it (``layers.interrupts``):
        the velocity and the parameters never disagree.

        ``grads`` (default: the parameter set's own, ``parameters.grads``):
        the gradients to step by, an array of the same shape in any format
        of the handler's class, read in its own format in the step's one
        pass.  A mixed-precision network's half gradients (``net.compute[1]``)
        need no cast into the master format first (``Trainer`` passes them
        where nothing else reads the master gradients).

        ``working`` (default: none): an array of the parameters' shape in any
        format of the handler's class, into which the step also writes the
        new parameters, rounded once, in the same pass: a mixed-precision
        network's working copy (``net.compute[0]``), which its next forward
        pass then need not cast from the master parameters
        (``Sequential.forward(refresh=False)``; ``Trainer`` does so).

        ValueError for ``grads`` or ``working`` of another shape, before
        anything is written.
        """
        p = self.parameters
        if grads is None:
            grads = p.grads
        for name, a in (("grads", grads), ("working", working)):
            if a is not None and tuple(a.shape) != tuple(p.grads.shape):
                raise ValueError(f"SGD.step: {name} must have the parameters' shape "
                                 f"{tuple(p.grads.shape)}, got {tuple(a.shape)}")
        with interrupts.deferred():
            self._step(gate, grads, working)

    def _step(self, gate, grads, working):
        h, p = self.parameters.h, self.parameters
        own = grads is p.grads   # a separate binding each: neither rebinds the other
        op, out = (_SGD_STEP, ()) if working is None else (_SGD_STEP_WORKING, (working,))
        key = (own, working is None)
        if gate is None:   # -lr, momentum and 1
            run_bound(self._bound, ("step",) + key, h, op, grads, self._neg_lr,
                      self._momentum, self._one, self.velocity, p.params, *out)
            return
        alpha, beta, g = self._gated_views
        h.copy_to(self._unit, self._gated)
        h.axpby(-1.0, gate, 1.0, beta)                 # 1 - gate
        h.axpby(gate, self._scalars, 1.0, self._gated)
        run_bound(self._bound, ("gated step",) + key, h, op, grads, alpha, beta, g,
                  self.velocity, p.params, *out)


class Adam(NoCopies):
    """Adam (Kingma and Ba) over a whole ``ParameterSet``, as ``torch.optim.Adam``.

    With t the step number (1 for the first step) and g the gradient::

        g = g + weight_decay * p                      (L2, Adam only)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        p = p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)

    A step is one fused ``adam_update`` over the flat buffers (it reads p, g,
    m and v once and writes p, m and v once), whatever the number of layers.
    The step count and ``lr`` live on the device, the count advanced by the
    update itself, so a step captured as a graph replays with the right bias
    corrections and sees a new ``lr``.  Setting ``lr`` queues a one-element
    fill on group 0; do it outside a capture.  ``betas``, ``eps`` and
    ``weight_decay`` are fixed at construction (a captured step holds them).

    Args:
        parameters: a ``ParameterSet`` (``net.parameters``).
        lr: learning rate, finite and >= 0.
        betas: (beta1, beta2), each in [0, 1).
        eps: finite and > 0, added after the square root.
        weight_decay: finite and >= 0.

    Raises ValueError for a hyperparameter out of range, NaN or infinite (or
    betas that are not a pair) and TypeError for one that is not a real
    number (or parameters that are not a ``ParameterSet``), before anything
    is allocated or written; the ``lr`` setter too.
    """

    #: AdamW's decoupled weight decay instead of Adam's L2 term
    decoupled = False

    def __init__(self, parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        name = type(self).__name__
        self.parameters = _parameter_set(name, parameters)
        try:
            beta1, beta2 = betas
        except (TypeError, ValueError):
            raise ValueError(f"{name}: betas must be a pair of numbers, got {betas!r}") from None
        beta1, beta2 = check_scalar(name, "beta1", beta1), check_scalar(name, "beta2", beta2)
        eps, weight_decay = check_scalar(name, "eps", eps), check_scalar(name, "weight_decay",
                                                                     weight_decay)
        check_adam_hyperparameters(name, beta1, beta2, eps, weight_decay)
        lr = _rate(name, lr)
        self.betas, self.eps = (beta1, beta2), eps
        self.weight_decay = weight_decay
        h = parameters.h
        self._state = h.zeros((2,))      # lr, steps taken (both read by the update kernel)
        self._lr_dev = view(h, self._state, 0, (1,))
        self._steps = view(h, self._state, 1, (1,))
        self.lr = lr
        #: first and second moments, one element per parameter element
        self.m = h.zeros(parameters.params.shape)
        self.v = h.zeros(parameters.params.shape)

    @property
    def lr(self):
        """The learning rate, finite and >= 0 (checked when set)."""
        return self._lr

    @lr.setter
    def lr(self, value):
        lr = _rate(type(self).__name__, value)   # checked before the device scalar is filled
        self.parameters.h.fill(self._lr_dev, lr)
        self._lr = lr

    @property
    def steps(self):
        """The number of steps taken (a host read: blocks until they ran)."""
        return int(self.parameters.h.get_numpy_copy(self._steps)[0])

    # ------------------------------------------------------------------ state
    def state_dict(self):
        """``{"optimizer": "Adam" (or "AdamW"), "lr", "betas", "eps",
        "weight_decay", "steps"}`` and the moments of each parameter,
        ``"m.<parameter name>"`` and ``"v.<parameter name>"`` (host reads:
        waits for the device)."""
        p, h = self.parameters, self.parameters.h
        return {"optimizer": type(self).__name__, "lr": self.lr, "betas": list(self.betas),
                "eps": self.eps, "weight_decay": self.weight_decay, "steps": self.steps,
                **p.split(h.get_numpy_copy(self.m), "m."),
                **p.split(h.get_numpy_copy(self.v), "v.")}

    def loader(self, state, cast=False):
        """Check ``state`` (a ``state_dict()`` of the same optimizer class
        over the same parameters) and return the function that writes it;
        ValueError naming the first mismatch, before anything is written.
        ``betas``, ``eps`` and ``weight_decay`` must be this optimizer's
        (a captured step holds them): build it with the checkpoint's."""
        name = type(self).__name__
        c = ArrayChecker(f"{name}.load_state_dict", state, cast)
        _check_kind(c, name)
        lr = _rate(name, c.value("lr", (int, float)))
        fixed = {"betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay}
        for key, mine in fixed.items():
            theirs = c.value(key)
            if theirs != mine:
                raise ValueError(f"{name}.load_state_dict: the state's {key} is {theirs!r}, "
                                 f"this optimizer's {mine!r}; build it with {key}={theirs!r}")
        steps = c.value("steps", int)
        limit = dtypes.exact_integers(self.parameters.h.dtype)
        if not 0 <= steps <= limit:
            raise ValueError(f"{name}.load_state_dict: steps must be in [0, {limit}], "
                             f"got {steps}")
        m, v = self.parameters.join(c, "m."), self.parameters.join(c, "v.")
        c.done()

        def write():
            h = self.parameters.h
            self.lr = lr
            h.fill(self._steps, float(steps))
            h.set_from_numpy(self.m, m)
            h.set_from_numpy(self.v, v)
        return write

    def load_state_dict(self, state, cast=False):
        """Restore ``lr``, the step count and the moments from ``state``
        (see ``loader``); nothing is written unless all of it fits."""
        self.loader(state, cast)()

    def step(self, gate=None):
        """Update every parameter from the gradients of the last backward.

        ``gate`` (a one-element array of the handler, e.g. a
        ``LossScaler``'s flag): where it holds 0 nothing changes, not even
        the step count (``adam_update``'s gate), decided on the device.  A
        Ctrl-C during the step is raised after it (``layers.interrupts``):
        the moments, the step count and the parameters never disagree."""
        h, p = self.parameters.h, self.parameters
        beta1, beta2 = self.betas
        with interrupts.deferred():
            h.adam_update(p.grads, self._lr_dev, beta1, beta2, self.eps, self.weight_decay,
                          self._steps, self.m, self.v, p.params, decoupled=self.decoupled,
                          gate=1.0 if gate is None else gate)


class AdamW(Adam):
    """AdamW (Loshchilov and Hutter), as ``torch.optim.AdamW``: Adam whose
    weight decay is decoupled from the gradient, applied to the parameters
    before the Adam step::

        p = p * (1 - lr * weight_decay)

    and the moments see the plain gradient.  Otherwise as ``Adam``; the
    default ``weight_decay`` is 0.01.
    """

    decoupled = True

    def __init__(self, parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(parameters, lr, betas, eps, weight_decay)
