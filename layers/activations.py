"""Elementwise activation layers: ``Sigmoid``, ``Tanh``, ``ReLU``, ``ELU``.

Each is one handler op forward (``h.<op>(x, y)``) and one backward
(``h.<op>_deriv(x, y, dy, dx)``); inputs of any shape.
"""
from .base import Layer


class Activation(Layer):
    """An elementwise nonlinearity named by its handler op (``op`` and
    ``op + "_deriv"``).  Subclasses only set ``op``."""

    op = None
    #: Whether the dense layer before this one applies it (``Sequential``'s
    #: fusion): then forward and backward pass their argument through.
    fused = False

    def forward(self, x, training=True):
        if self.fused:
            return x
        b = self.buffers(x.shape, y=x.shape, dx=x.shape)
        getattr(self.h, self.op)(x, b.y)
        self._x, self._y = x, b.y
        return b.y

    def backward(self, dy):
        if not self.input_grad:
            return None
        if self.fused:
            return dy
        b = self.buffers(dy.shape)
        getattr(self.h, self.op + "_deriv")(self._x, self._y, dy, b.dx)
        return b.dx


class Sigmoid(Activation):
    """y = 1 / (1 + exp(-x))."""
    op = "sigmoid"


class Tanh(Activation):
    """y = tanh(x)."""
    op = "tanh"


class ReLU(Activation):
    """y = max(x, 0); the derivative at 0 is taken as 0."""
    op = "relu"


class ELU(Activation):
    """y = x for x > 0, exp(x) - 1 otherwise (alpha = 1)."""
    op = "elu"
