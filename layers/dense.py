"""``FullyConnected``: y = x @ W + b."""
import math

from . import epilogues, init
from .base import Layer
from .params import view


class FullyConnected(Layer):
    """Affine layer y = x @ W + b, with W (n_in, n_out) and b (1, n_out).

    The input is (n, n_in), or (..., n_in), whose leading axes are flattened
    into one batch axis (so the layer applies to every time step of a
    (T, B, n_in) sequence).  Weights start Glorot-uniform, the bias at 0.

    ``activation`` (None, or a name of ``layers.epilogues.FORMULAS``:
    "relu", "tanh", "sigmoid", "elu", "gelu", "gelu_tanh", "silu") makes the
    layer y = act(x @ W + b), the bias and the activation one op after the
    product (``layers.epilogues``); ``Sequential`` sets it for an activation
    layer that follows.  Without an activation, or with ReLU, the forward is
    one ``dot_bias_act`` (on a GPU, one cuBLASLt product with the bias and
    ReLU in its epilogue).
    """

    def __init__(self, n_in, n_out, activation=None):
        super().__init__()
        self.n_in, self.n_out = int(n_in), int(n_out)
        #: The activation fused after the bias, or None (the affine layer).
        self.activation = epilogues.check_activation("FullyConnected", activation)
        #: Whether ``activation`` is the next layer's, fused by ``Sequential``.
        self.paired = False

    def __repr__(self):
        return f"FullyConnected({self.n_in}, {self.n_out}{epilogues.repr_part(self)})"

    def param_shapes(self):
        return {"W": (self.n_in, self.n_out), "b": (1, self.n_out)}

    def init_params(self, rng, host):
        init.glorot_uniform(rng, host["W"], self.n_in, self.n_out)
        init.constant(host["b"], 0.0)

    def _bufs(self, shape):
        def build():
            h = self.h
            n = math.prod(shape[:-1])
            y = h.allocate(shape[:-1] + (self.n_out,))
            dx = h.allocate(shape)
            # 2-D views of N-D arrays: the gemms want matrices.
            return (n, y, view(h, y, 0, (n, self.n_out)), dx, view(h, dx, 0, (n, self.n_in)))
        return self.cached(shape, build)

    def forward(self, x, training=True):
        self.check_input(x, (2, 3, 4), self.n_in)
        h = self.h
        n, y, y2, _, _ = self._bufs(x.shape)
        x2 = x if len(x.shape) == 2 else view(h, x, 0, (n, self.n_in))
        self._x2, self._y2 = x2, y2
        if self.activation in epilogues.ONE_OP:
            # y = act(x @ W + b) as one op: on a GPU one cuBLASLt product
            # with the bias and activation in its epilogue
            h.dot_bias_act(x2, self.params["W"], self.params["b"], y2, self.activation)
            return y
        h.dot_mm(x2, self.params["W"], y2)
        # y = act(z + b), in place, and z + b kept where act' reads it
        self.run_fused(("forward", n), epilogues.OPS[self.activation][0], y2,
                       self.params["b"], y2, *self._aux(n))
        return y

    def _aux(self, n):
        """() or (the buffer that keeps z + b for an activation whose
        derivative reads it)."""
        if not epilogues.keeps_input(self.activation):
            return ()
        return (self.cached(("aux", n), lambda: self.h.allocate((n, self.n_out))),)

    def backward(self, dy):
        h = self.h
        n, _, _, dx, dx2 = self._bufs(dy.shape[:-1] + (self.n_in,))
        dy2 = dy if len(dy.shape) == 2 else view(h, dy, 0, (n, self.n_out))
        if self.activation is None:
            h.sum_t(dy2, 0, self.grads["b"])                     # db = sum over the batch
        else:   # dL/dz = dy * act'(z), from y; db its sum over the batch
            g = self.cached(("g", n), lambda: h.allocate((n, self.n_out)))
            kept = self._aux(n) or (self._y2,)
            self.run_fused(("backward", n), epilogues.OPS[self.activation][1], dy2, kept[0], g,
                           self.grads["b"])
            dy2 = g
        h.dot_mm(self._x2, dy2, self.grads["W"], transa=True)   # dW = x^T dy
        if not self.input_grad:
            return None
        h.dot_mm(dy2, self.params["W"], dx2, transb=True)        # dx = dy W^T
        return dx

