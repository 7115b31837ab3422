"""``SGD``: stochastic gradient descent with momentum on the flat buffers."""


class SGD:
    """SGD with momentum over a whole ``ParameterSet``:

        v = momentum * v - lr * g
        p = p + v

    Each line is one ``axpby`` over the flat buffers, so a step is two device
    ops whatever the number of layers, with no host round trip.  ``lr`` and
    ``momentum`` may be changed between steps (schedules).

    Args:
        parameters: a ``ParameterSet`` (``net.parameters``).
        lr: learning rate.
        momentum: in [0, 1).
    """

    def __init__(self, parameters, lr=0.1, momentum=0.9):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"SGD: momentum must be in [0, 1), got {momentum}")
        self.parameters = parameters
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.velocity = parameters.h.zeros(parameters.params.shape)

    def step(self):
        """Update every parameter from the gradients of the last backward."""
        h, p = self.parameters.h, self.parameters
        h.axpby(-self.lr, p.grads, self.momentum, self.velocity)
        h.axpby(1.0, self.velocity, 1.0, p.params)
