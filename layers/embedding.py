"""``Embedding``: a learned vector per token id, looked up on the device."""
import math
from types import SimpleNamespace

from handlers import dtypes

from .base import Layer


class Embedding(Layer):
    """y[i, :] = W[ids[i], :], rows of a learned table W (vocab, d).

    The input holds integer ids stored as floats, like class labels: shape
    (n,) or (n, 1), and the output is (n, d); or (B, T) sequences of T > 1
    ids, and the output is (B, T, d).  A fractional id is truncated
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

    Ids must be exact in their format: a half format holds whole numbers
    only up to 256 (bfloat16) or 2048 (float16), so ids of that format for a
    larger vocabulary raise ValueError before any work.  Under mixed
    precision (``Sequential.mixed_precision``) the ids come in the master
    format instead (``net.input_h``, float32 say): the rows are looked up in
    the master table and rounded once into the compute format (the bits a
    lookup in the working copy gives), and the gradient is added up in the
    master format and rounded once into the half gradient.  That path keeps
    one more table-sized buffer of the master format.
    """

    #: the input holds indices: under mixed precision ``Sequential`` gives
    #: them in the master format (``input_h``) and calls ``use_master``
    takes_indices = True

    def __init__(self, vocab, d):
        super().__init__()
        self.vocab, self.d = int(vocab), int(d)
        if self.vocab < 1 or self.d < 1:
            raise ValueError(f"Embedding: vocab and d must be >= 1, got {vocab}, {d}")
        self._master = None

    def use_master(self, h, params):
        """Mixed precision: ids of ``h``'s format (the master's) are looked up
        in ``params["W"]``, the master table, a view of ``h``."""
        self._master = (h, params["W"])

    def __repr__(self):
        return f"Embedding({self.vocab}, {self.d})"

    def param_shapes(self):
        return {"W": (self.vocab, self.d)}

    def init_params(self, rng, host):
        host["W"][...] = rng.standard_normal(host["W"].shape)

    def forward(self, x, training=True):
        if len(x.shape) not in (1, 2):
            raise ValueError(f"{self!r}: ids must have shape (n,), (n, 1) or (B, T), "
                             f"got {x.shape}")
        n = math.prod(x.shape)
        b = self.buffers(("y", n), y=(n, self.d))
        out = b.y
        if len(x.shape) == 2 and x.shape[1] != 1:   # (B, T) sequences: (B, T, d) out
            out = self.reshaped("y", b.y, tuple(x.shape) + (self.d,))
            x = self.reshaped("ids", x, (n, 1))
        self._ids = x
        if self._master is not None and x.dtype == self._master[0].dtype:
            hm, table = self._master
            m = self._master_buffers(n)
            hm.gather_rows_m(table, x, m.y)
            self.h.cast_t(m.y, b.y)               # rounded once, as the working copy is
            return out
        limit = dtypes.exact_integers(x.dtype)
        if self.vocab - 1 > limit:
            where = ("pass them in the master format (net.input_h)" if self._master is not None
                     else "train in mixed precision, which takes them in the master format")
            raise ValueError(f"{self!r}: ids in {x.dtype} are exact only up to {limit}, too "
                             f"few for a vocabulary of {self.vocab}: {where}")
        self.h.gather_rows_m(self.params["W"], x, b.y)
        return out

    def _master_buffers(self, n):
        """Master-format buffers of the mixed-precision path: the rows, dy,
        and the table-sized gradient (one, whatever n)."""
        hm = self._master[0]
        grad = self.cached("master dW", lambda: hm.allocate((self.vocab, self.d)))
        return self.cached(("master", n), lambda: SimpleNamespace(
            y=hm.allocate((n, self.d)), dy=hm.allocate((n, self.d)), dW=grad))

    def backward(self, dy):
        h = self.h
        n = math.prod(self._ids.shape)
        if len(dy.shape) == 3 and math.prod(dy.shape[:2]) == n and dy.shape[2] == self.d:
            dy = self.reshaped("dy", dy, (n, self.d))      # (B, T, d) sequences
        if tuple(dy.shape) != (n, self.d):
            raise ValueError(f"{self!r}: dy must have the output's shape {(n, self.d)}, "
                             f"got {tuple(dy.shape)}")
        dW = self.grads["W"]
        if self._master is not None and self._ids.dtype == self._master[0].dtype:
            hm, m = self._master[0], self._master_buffers(n)
            hm.cast_t(dy, m.dy)                   # exact: a half number is a master number
            hm.fill(m.dW, 0.0)
            hm.scatter_add_rows_m(m.dy, self._ids, m.dW)
            h.cast_t(m.dW, dW)                    # rounded once into the half gradient
            return None
        h.fill(dW, 0.0)                           # backward overwrites the gradient
        h.scatter_add_rows_m(dy, self._ids, dW)   # repeated ids add up
        return None
