"""A user's package: one layer and one fused op, written against the
handler API only, so they run on every handler streamhandlers has."""
from handlers import fused_op
from layers import Layer

#: swish(x) = x * sigmoid(x), one generated kernel on a GPU.
swish = fused_op("swish", inputs="x", outputs="y", body="y = x * sigmoid(x)")


class FeatureAffine(Layer):
    """y = x * w + b, feature by feature: x (n, d), w and b (1, d)."""

    def __init__(self, d):
        super().__init__()
        self.d = d

    def __repr__(self):
        return f"FeatureAffine({self.d})"

    def param_shapes(self):
        return {"w": (1, self.d), "b": (1, self.d)}

    def init_params(self, rng, host):
        host["w"][...] = 1.0
        host["b"][...] = 0.0

    def forward(self, x, training=True):
        self.check_input(x, 2, self.d)
        h, self._x = self.h, x
        buf = self.buffers(x.shape, y=x.shape, dx=x.shape, t=x.shape)
        h.mult_mv(x, self.params["w"], buf.y)
        h.add_mv(buf.y, self.params["b"], buf.y)
        return buf.y

    def backward(self, dy):
        h = self.h
        buf = self.buffers(dy.shape, y=dy.shape, dx=dy.shape, t=dy.shape)
        h.mult_tt(dy, self._x, buf.t)
        h.sum_t(buf.t, 0, self.grads["w"])          # dL/dw = sum over rows of dy * x
        h.sum_t(dy, 0, self.grads["b"])             # dL/db = sum over rows of dy
        if not self.input_grad:
            return None
        h.mult_mv(dy, self.params["w"], buf.dx)     # dL/dx = dy * w
        return buf.dx
