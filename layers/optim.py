"""``SGD``: stochastic gradient descent with momentum on the flat buffers."""
from .params import view


class SGD:
    """SGD with momentum over a whole ``ParameterSet``:

        v = momentum * v - lr * g
        p = p + v

    Each line is one ``axpby`` over the flat buffers, so a step is two device
    ops whatever the number of layers, with no host round trip.  ``lr`` and
    ``momentum`` may be changed between steps (schedules): they live on the
    device as ``axpby``'s device scalars, so a step captured as a graph
    (``Handler.capture``) sees the new values on its next replay.  Setting
    one queues a one-element fill on group 0; do it outside a capture.

    Args:
        parameters: a ``ParameterSet`` (``net.parameters``).
        lr: learning rate.
        momentum: in [0, 1).
    """

    def __init__(self, parameters, lr=0.1, momentum=0.9):
        self.parameters = parameters
        h = parameters.h
        self._scalars = h.zeros((2,))    # -lr, momentum
        self._neg_lr = view(h, self._scalars, 0, (1,))
        self._momentum = view(h, self._scalars, 1, (1,))
        self.lr = lr
        self.momentum = momentum
        self.velocity = h.zeros(parameters.params.shape)

    @property
    def lr(self):
        """The learning rate."""
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = float(value)
        self.parameters.h.fill(self._neg_lr, -self._lr)

    @property
    def momentum(self):
        """The momentum, in [0, 1)."""
        return self._mom

    @momentum.setter
    def momentum(self, value):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"SGD: momentum must be in [0, 1), got {value}")
        self._mom = float(value)
        self.parameters.h.fill(self._momentum, self._mom)

    def step(self):
        """Update every parameter from the gradients of the last backward."""
        h, p = self.parameters.h, self.parameters
        h.axpby(self._neg_lr, p.grads, self._momentum, self.velocity)
        h.axpby(1.0, self.velocity, 1.0, p.params)
