"""Elementwise activation layers: ``Sigmoid``, ``Tanh``, ``ReLU``, ``ELU``,
``GELU`` and ``SiLU``.

Each is one op forward and one backward, inputs of any shape: a handler op
(``h.<op>(x, y)``, ``h.<op>_deriv(x, y, dy, dx)``), or for GELU and SiLU a
fused op of ``layers.epilogues``, whose formulas the fused dense and
convolution layers share.
"""
from . import epilogues
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
        self._apply(x, b.y)
        self._x, self._y = x, b.y
        return b.y

    def backward(self, dy):
        if not self.input_grad:
            return None
        if self.fused:
            return dy
        b = self.buffers(dy.shape)
        self._apply_deriv(dy, b.dx)
        return b.dx

    def _apply(self, x, y):
        """y = the activation of x."""
        getattr(self.h, self.op)(x, y)

    def _apply_deriv(self, dy, dx):
        """dx = dy times the derivative at the last forward's input."""
        getattr(self.h, self.op + "_deriv")(self._x, self._y, dy, dx)


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


class _FusedActivation(Activation):
    """An activation with no contract op: forward and backward are the fused
    ops of ``layers.epilogues.LAYER_OPS`` (its derivative reads x)."""

    def _apply(self, x, y):
        self.run_fused(("forward", x.shape), epilogues.LAYER_OPS[self.op][0], x, y)

    def _apply_deriv(self, dy, dx):
        self.run_fused(("backward", dy.shape), epilogues.LAYER_OPS[self.op][1], dy, self._x, dx)


class GELU(_FusedActivation):
    """y = x * P(X <= x), X standard normal: 0.5 x (1 + erf(x / sqrt(2)))
    (``approximate="none"``, PyTorch's default), or its tanh approximation
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (``"tanh"``, GPT-2's)."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self.op = "gelu" if approximate == "none" else "gelu_tanh"

    def __repr__(self):
        return "GELU()" if self.approximate == "none" else "GELU(approximate='tanh')"


class SiLU(_FusedActivation):
    """y = x * sigmoid(x) (the swish of Ramachandran et al.)."""
    op = "silu"
