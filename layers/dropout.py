"""``Dropout``: inverted dropout with masks drawn on the device."""
from handlers.checks import check_scalar

from .base import Layer


class Dropout(Layer):
    """Zero each input element with probability ``p`` while training and scale
    the survivors by 1 / (1 - p), so inference (which passes ``x`` through
    unchanged) needs no rescaling.

    The mask comes from ``h.generate_probability_mask`` (the handler's seeded
    generator).  Setting ``resample`` to False keeps the last mask of each
    input shape, which makes the layer deterministic (gradient checks).
    """

    def __init__(self, p=0.5):
        super().__init__()
        p = check_scalar("Dropout", "p", p)
        if not 0.0 <= p < 1.0:   # NaN fails too
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = float(p)
        self.resample = True

    def __repr__(self):
        return f"Dropout(p={self.p})"

    def forward(self, x, training=True):
        self._active = training and self.p > 0.0
        if not self._active:
            return x
        h = self.h
        fresh = x.shape not in self._cache
        b = self.buffers(x.shape, mask=x.shape, y=x.shape, dx=x.shape)
        if self.resample or fresh:
            keep = 1.0 - self.p
            h.generate_probability_mask(b.mask, keep)
            h.mult_st(1.0 / keep, b.mask, b.mask)   # fold the rescaling into the mask
        h.mult_tt(x, b.mask, b.y)
        return b.y

    def backward(self, dy):
        if not self.input_grad:
            return None
        if not self._active:
            return dy
        b = self.buffers(dy.shape)
        self.h.mult_tt(dy, b.mask, b.dx)
        return b.dx
