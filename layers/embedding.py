"""``Embedding``: a learned vector per token id, looked up on the device."""
import math

from .base import Layer


class Embedding(Layer):
    """y[i, :] = W[ids[i], :], rows of a learned table W (vocab, d).

    The input holds integer ids stored as floats, like class labels: shape
    (n,) or (n, 1); the output is (n, d).  A fractional id is truncated
    towards zero (float32 holds whole numbers exactly up to 2**24).  W starts
    as N(0, 1) samples.

    The lookup is ``gather_rows_m`` and the gradient ``scatter_add_rows_m``
    (dW[ids[i], :] += dy[i, :], deterministic), so nothing leaves the device.
    Ids are data, which the layer never reads on the host; an id outside
    [0, vocab) (or NaN) is caught where it can be: NumpyHandler raises
    ``ValueError`` naming it, and PyCudaHandler gives that sample a row of
    NaN in the output (so the loss becomes NaN and the trainer stops with
    ``NonFiniteLossError``) and leaves W's gradient without its
    contribution; no memory outside the table is read or written.  Validate
    ids on the host when the data is loaded to get the error on every handler.

    Ids have no gradient: ``backward`` returns None, so the layer comes first
    in a network (``Sequential`` makes the first layer's ``input_grad``
    False).
    """

    def __init__(self, vocab, d):
        super().__init__()
        self.vocab, self.d = int(vocab), int(d)
        if self.vocab < 1 or self.d < 1:
            raise ValueError(f"Embedding: vocab and d must be >= 1, got {vocab}, {d}")

    def __repr__(self):
        return f"Embedding({self.vocab}, {self.d})"

    def param_shapes(self):
        return {"W": (self.vocab, self.d)}

    def init_params(self, rng, host):
        host["W"][...] = rng.standard_normal(host["W"].shape)

    def forward(self, x, training=True):
        if len(x.shape) not in (1, 2) or (len(x.shape) == 2 and x.shape[1] != 1):
            raise ValueError(f"{self!r}: ids must have shape (n,) or (n, 1), got {x.shape}")
        n = math.prod(x.shape)
        b = self.buffers(("y", n), y=(n, self.d))
        self.h.gather_rows_m(self.params["W"], x, b.y)
        self._ids = x
        return b.y

    def backward(self, dy):
        h = self.h
        n = math.prod(self._ids.shape)
        if tuple(dy.shape) != (n, self.d):
            raise ValueError(f"{self!r}: dy must have the output's shape {(n, self.d)}, "
                             f"got {tuple(dy.shape)}")
        dW = self.grads["W"]
        h.fill(dW, 0.0)                           # backward overwrites the gradient
        h.scatter_add_rows_m(dy, self._ids, dW)   # repeated ids add up
        return None
