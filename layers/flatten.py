"""``Flatten``: (N, C, H, W) -> (N, C*H*W) as a view, no copy."""
import math

from .base import Layer


class Flatten(Layer):
    """Reshape (N, d1, d2, ...) to (N, d1*d2*...), e.g. a conv stack's (N, C, H,
    W) output for a ``FullyConnected`` layer.

    Both directions are views (``reshape_t``): forward returns its input's
    memory seen as a matrix and backward ``dy``'s memory seen in the input's
    shape, so the layer issues no work at all.  The output therefore changes
    when the input does, and dL/dx is ``dy``'s memory: both stay valid as
    long as the arrays they view.  A view is a new array object, made once per
    input array and kept, so a step makes none.  Inputs need rank >= 2.
    """

    def __repr__(self):
        return "Flatten()"

    def forward(self, x, training=True):
        if len(x.shape) < 2:
            raise ValueError(f"{self!r}: x must have rank >= 2, got shape {tuple(x.shape)}")
        self._shape = tuple(x.shape)
        n = self._shape[0]
        return self.reshaped(("y", self._shape), x, (n, math.prod(self._shape[1:])))

    def backward(self, dy):
        if not self.input_grad:
            return None
        shape = self._shape
        if tuple(dy.shape) != (shape[0], math.prod(shape[1:])):
            raise ValueError(f"{self!r}: dy must have shape "
                             f"{(shape[0], math.prod(shape[1:]))}, got {tuple(dy.shape)}")
        return self.reshaped(("dx", shape), dy, shape)
