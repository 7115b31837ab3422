"""``Sequential``: a chain of layers ending in a loss, over one flat parameter set."""
from handlers import dtypes

from .params import ParameterSet


class Sequential:
    """Layers applied one after another, then a loss.

    Binds every layer to the handler ``h`` and lays all parameters out in one
    ``ParameterSet`` (``self.parameters``: flat ``params`` and ``grads``
    buffers), initialized from ``seed``.  The first layer does not compute the
    gradient of the data unless ``input_grad`` is True.

    Args:
        h: the handler.
        layers: the layers, input side first.
        loss: a loss layer (``SoftmaxCrossEntropy``, ``SquaredError``, ...).
        seed: seed of the parameter initializers.
        input_grad: compute dL/dx of the network input in ``backward``.
    """

    def __init__(self, h, layers, loss, seed=0, input_grad=False):
        self.h = h
        self.layers = list(layers)
        self.loss = loss
        for layer in self.layers + [loss]:
            layer.bind(h)
        self.parameters = ParameterSet(h, self.layers, seed)
        #: (params, grads) of the compute format under mixed precision, else None
        self.compute = None
        if self.layers:
            self.layers[0].input_grad = input_grad

    def mixed_precision(self, dtype):
        """Compute in ``dtype`` (float16 or bfloat16) and keep the parameters
        in the network's own format as the master copy.

        The layers move to ``h.twin(dtype)`` (``self.h`` becomes it; feed
        inputs and targets of that handler), with their parameters and
        gradients in half-format working buffers (``self.compute``), while
        ``parameters`` (and ``params``, ``grads``) stay the master copy, in
        float32 say, which the optimizer updates.  Each forward pass first
        rounds the master parameters into the working copy (one ``cast_t``);
        ``train_step`` ends by carrying the half gradients into the master
        gradients (one ``cast_t``), so the optimizer, its state and its
        update run in the master format.  Once per network: ValueError if
        called again or for a format that is not a half format.
        """
        master = self.parameters.h
        dt = dtypes.resolve(dtype)
        if not dtypes.is_half(dt):
            raise ValueError(f"mixed_precision: the compute format must be float16 or bfloat16, "
                             f"got {dt}")
        if self.compute is not None:
            raise ValueError("mixed_precision: this network already computes in "
                             f"{self.h.dtype}")
        hc = master.twin(dt)
        for layer in self.layers + [self.loss]:
            layer.bind(hc)
        self.compute = self.parameters.compute_copies(hc)
        self.h = hc

    def __repr__(self):
        inner = ", ".join(repr(layer) for layer in self.layers)
        return f"Sequential([{inner}], loss={self.loss!r})"

    @property
    def params(self):
        """The flat parameter buffer (a handler array)."""
        return self.parameters.params

    @property
    def grads(self):
        """The flat gradient buffer, same layout as ``params``."""
        return self.parameters.grads

    def forward(self, x, training=False):
        """Output of the last layer for input ``x`` (no loss)."""
        if self.compute is not None:   # the working copy of the master parameters
            self.h.cast_t(self.parameters.params, self.compute[0])
        for layer in self.layers:
            x = layer.forward(x, training)
        return x

    def backward(self, dy):
        """Backpropagate dL/d(output) through the layers, writing every
        gradient; returns dL/dx if the first layer computes it, else None."""
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy

    def train_step(self, x, targets):
        """Forward, loss and backward for one batch; the gradients are written
        into ``grads``.  Returns the mean loss as a (1,) handler array (still
        on the device: nothing here waits for the device)."""
        loss = self.loss.forward(self.forward(x, training=True), targets)
        self.backward(self.loss.backward())
        if self.compute is not None:   # the gradients, into the master format
            self.parameters.h.cast_t(self.compute[1], self.parameters.grads)
        return loss

    def evaluate_batch(self, x, targets):
        """Inference forward pass and loss: returns (loss array, output)."""
        y = self.forward(x, training=False)
        return self.loss.forward(y, targets, training=False), y
