"""Convolution and pooling layers over NCHW images: ``Conv2D``, ``MaxPool2D``,
``AvgPool2D``.

Each is a thin layer over the contract's ops (``conv2d_forward``,
``conv2d_backward_data``, ``conv2d_backward_filter``, ``maxpool2d_*``,
``avgpool2d_*``): cuDNN on a GPU, im2col and BLAS on NumPy.  Inputs are
(N, C, H, W); ``Flatten`` turns the last one's output into the (N, features)
rows a ``FullyConnected`` layer takes.
"""
from handlers.shape_rules import conv_out_size

from . import epilogues, init
from .base import Layer
from .params import view


def _pair(value, name, owner, low):
    """``value`` (an int or a pair of ints) as a pair, each >= ``low``."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= low for v in pair):
        raise ValueError(f"{owner}: {name} must be an int or a pair of ints >= {low}, "
                         f"got {value!r}")
    return pair


class Conv2D(Layer):
    """2-D convolution (cross-correlation, as in PyTorch and cuDNN) with bias:
    y[n, k] = sum over c of x[n, c] * W[k, c] + b[k].

    Input (N, C, H, W) with C == ``c_in``; output (N, ``c_out``, P, Q), P =
    (H + 2*pad - dil*(R-1) - 1) // stride + 1 (Q likewise).  W has shape
    (``c_out``, ``c_in``, R, S) and starts Glorot-uniform (fans c_in*R*S and
    c_out*R*S); b has shape (``c_out``,) and starts at 0.

    Args:
        c_in, c_out: input and output channels.
        kernel: R, or (R, S).
        stride, padding, dilation: an int or a pair (height, width).
        activation: None, or a name of ``layers.epilogues.FORMULAS``: y =
            act(conv + b).  With None or ReLU the whole forward is one
            ``conv2d_bias_act``; otherwise the bias and the activation are
            one op after the convolution (``layers.epilogues``).
            ``Sequential`` sets it for an activation layer that follows.
    """

    def __init__(self, c_in, c_out, kernel, stride=1, padding=0, dilation=1, activation=None):
        super().__init__()
        name = f"Conv2D({c_in}, {c_out}, ...)"
        #: The activation fused after the bias, or None.
        self.activation = epilogues.check_activation(name, activation)
        #: Whether ``activation`` is the next layer's, fused by ``Sequential``.
        self.paired = False
        self.c_in, self.c_out = int(c_in), int(c_out)
        if self.c_in < 1 or self.c_out < 1:
            raise ValueError(f"{name}: channels must be >= 1")
        self.kernel = _pair(kernel, "kernel", name, 1)
        self.stride = _pair(stride, "stride", name, 1)
        self.padding = _pair(padding, "padding", name, 0)
        self.dilation = _pair(dilation, "dilation", name, 1)

    def __repr__(self):
        return (f"Conv2D({self.c_in}, {self.c_out}, kernel={self.kernel}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}{epilogues.repr_part(self)})")

    def param_shapes(self):
        return {"W": (self.c_out, self.c_in) + self.kernel, "b": (self.c_out,)}

    def init_params(self, rng, host):
        area = self.kernel[0] * self.kernel[1]
        init.glorot_uniform(rng, host["W"], self.c_in * area, self.c_out * area)
        init.constant(host["b"], 0.0)

    def output_shape(self, shape):
        """The output shape for an input of ``shape`` (N, C, H, W)."""
        n, _, hgt, wid = shape
        p = conv_out_size(hgt, self.kernel[0], self.stride[0], self.padding[0], self.dilation[0])
        q = conv_out_size(wid, self.kernel[1], self.stride[1], self.padding[1], self.dilation[1])
        return (n, self.c_out, p, q)

    def _bufs(self, shape):
        def build():
            h = self.h
            out = self.output_shape(shape)
            n, k, p, q = out
            if p < 1 or q < 1:
                raise ValueError(f"{self!r}: input {shape} is too small for the kernel "
                                 f"(output {out})")
            y = h.allocate(out)
            bufs = dict(y=y, dx=h.allocate(shape))
            if self.activation is not None:
                # (image, channel) planes as rows for the backward op
                db, g = h.allocate((n, k)), h.allocate(out)
                bufs.update(rows=view(h, y, 0, (n * k, p * q)), db=db,
                            db_planes=view(h, db, 0, (n * k, 1)),
                            g=g, g_rows=view(h, g, 0, (n * k, p * q)),
                            # z + b, kept where the activation's derivative reads it
                            aux=(h.allocate((n * k, p * q)),)
                            if epilogues.keeps_input(self.activation) else ())
            if self.activation not in epilogues.ONE_OP:
                # the forward's fused op: b repeated per image as a column
                planes = h.allocate((n, k))
                bufs.update(planes=planes, b_planes=view(h, planes, 0, (n * k, 1)),
                            b_row=view(h, self.params["b"], 0, (1, k)))
            return bufs
        return self.cached(shape, build)

    def forward(self, x, training=True):
        self.check_input(x, 4)
        if x.shape[1] != self.c_in:
            raise ValueError(f"{self!r}: x must have {self.c_in} channels, got shape {x.shape}")
        h, b = self.h, self._bufs(x.shape)
        self._x = x
        if self.activation in epilogues.ONE_OP:
            # y = act(conv + b) as one op: on a GPU one cuDNN graph where
            # cuDNN has an engine for it
            h.conv2d_bias_act(x, self.params["W"], self.params["b"], b["y"], self.stride,
                              self.padding, self.dilation, self.activation)
            return b["y"]
        h.conv2d_forward(x, self.params["W"], b["y"], self.stride, self.padding, self.dilation)
        # y = act(z + b) over the planes, in place
        h.broadcast_t(b["b_row"], 0, b["planes"])
        self.run_fused(("forward", x.shape), epilogues.CONV_OPS[self.activation][0],
                       b["rows"], b["b_planes"], b["rows"], *b["aux"])
        return b["y"]

    def _rows_of(self, dy, shape):
        """``dy`` as (images * channels, plane) rows: the same view for the
        same ``dy`` (a network passes one buffer each step), so the bound
        backward op is not bound again at every step."""
        last = getattr(self, "_dy_rows", None)
        if last is None or last[0] is not dy or last[1].shape != shape:
            last = self._dy_rows = (dy, view(self.h, dy, 0, shape))
        return last[1]

    def backward(self, dy):
        h, x = self.h, self._x
        b = self._bufs(x.shape)
        if self.activation is not None:
            # dL/dz = dy * act'(z), from y, and its sum along each plane, in
            # one op; then the planes' sums over the images
            self.run_fused(("backward", x.shape), epilogues.CONV_OPS[self.activation][1],
                           self._rows_of(dy, b["rows"].shape), (b["aux"] or (b["rows"],))[0],
                           b["g_rows"], b["db_planes"])
            h.sum_t(b["db"], 0, self.grads["b"])
            dy = b["g"]
        else:
            h.sum_t(dy, (0, 2, 3), self.grads["b"])     # one pass on the GPU
        h.conv2d_backward_filter(x, dy, self.grads["W"], self.stride, self.padding,
                                 self.dilation)
        if not self.input_grad:
            return None
        h.conv2d_backward_data(dy, self.params["W"], b["dx"], self.stride, self.padding,
                               self.dilation)
        return b["dx"]


class _Pool2D(Layer):
    """Shared by the pooling layers: window, stride (the window by default)
    and padding, each an int or a pair; no parameters."""

    kind = None

    def __init__(self, window, stride=None, padding=0):
        super().__init__()
        name = type(self).__name__
        self.window = _pair(window, "window", name, 1)
        self.stride = self.window if stride is None else _pair(stride, "stride", name, 1)
        self.padding = _pair(padding, "padding", name, 0)

    def __repr__(self):
        return (f"{type(self).__name__}(window={self.window}, stride={self.stride}, "
                f"padding={self.padding})")

    def output_shape(self, shape):
        """The output shape for an input of ``shape`` (N, C, H, W)."""
        n, c, hgt, wid = shape
        return (n, c, conv_out_size(hgt, self.window[0], self.stride[0], self.padding[0], 1),
                conv_out_size(wid, self.window[1], self.stride[1], self.padding[1], 1))

    def _bufs(self, shape):
        out = self.output_shape(shape)
        if out[2] < 1 or out[3] < 1:
            raise ValueError(f"{self!r}: input {shape} is too small for the window")
        extra = {"argmax": out} if self.kind == "max" else {}
        return self.buffers(shape, y=out, dx=shape, **extra)

    def forward(self, x, training=True):
        self.check_input(x, 4)
        self._shape = x.shape
        b = self._bufs(x.shape)
        if self.kind == "max":
            self.h.maxpool2d_forward(x, b.y, b.argmax, self.window, self.stride, self.padding)
        else:
            self.h.avgpool2d_forward(x, b.y, self.window, self.stride, self.padding)
        return b.y

    def backward(self, dy):
        if not self.input_grad:
            return None
        b = self._bufs(self._shape)
        if self.kind == "max":
            self.h.maxpool2d_backward(b.argmax, dy, b.dx, self.window, self.stride,
                                      self.padding)
        else:
            self.h.avgpool2d_backward(dy, b.dx, self.window, self.stride, self.padding)
        return b.dx


class MaxPool2D(_Pool2D):
    """Max pooling over (window) patches of each channel; padding counts as
    -inf.  The gradient goes to the first maximum of each window (the
    argmax the forward pass stored), summed where windows overlap."""

    kind = "max"


class AvgPool2D(_Pool2D):
    """Average pooling over (window) patches of each channel; the divisor is
    the number of elements of the window inside the image (padding is not
    counted)."""

    kind = "avg"
