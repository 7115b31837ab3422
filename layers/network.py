"""``Sequential``: a chain of layers ending in a loss, over one flat parameter set."""
import numpy as np

from handlers import dtypes

from . import checkpoint
from .activations import ELU, GELU, ReLU, Sigmoid, SiLU, Tanh
from .base import check_initialized
from .compose import Chain
from .conv import Conv2D
from .dense import FullyConnected
from .loss_scale import LossScaler
from .params import ParameterSet, walk

#: The activation layers a network fuses into the dense layer before them.
FUSABLE = (ReLU, Tanh, Sigmoid, ELU, GELU, SiLU)


def fuse_layers(layers):
    """Fuse each ``FullyConnected`` or ``Conv2D`` (exactly those classes: a
    subclass may compute otherwise) with a fusable activation layer right
    after it: that layer applies the activation (``layers.epilogues``), the
    activation layer passes its input through.  Returns the pairs fused."""
    pairs = 0
    for dense, act in zip(layers, layers[1:]):
        if (type(dense) in (FullyConnected, Conv2D) and type(act) in FUSABLE
                and dense.activation is None and not act.fused):
            # paired: the activation is the next layer's (repr stays as written)
            dense.activation, dense.paired, act.fused = act.op, True, True
            pairs += 1
    return pairs


class Sequential(checkpoint.NoCopies):
    """Layers applied one after another, then a loss.

    Binds every layer to the handler ``h`` and lays all parameters out in one
    ``ParameterSet`` (``self.parameters``: flat ``params`` and ``grads``
    buffers), initialized from ``seed``.  The first layer does not compute the
    gradient of the data unless ``input_grad`` is True.

    Args:
        h: the handler.
        layers: the layers, input side first (each layer object once, here
            or inside a container: a layer keeps one step's state and one
            set of parameter views, so ValueError for one placed twice;
            TypeError, before any layer is touched, for a ``Layer``
            subclass whose ``__init__`` did not call ``super().__init__()``).
        loss: a loss layer (``SoftmaxCrossEntropy``, ``SquaredError``, ...).
        seed: seed of the parameter initializers.
        input_grad: compute dL/dx of the network input in ``backward``.
        fuse: run each ``FullyConnected`` or ``Conv2D`` followed by a
            ``ReLU``, ``Tanh``, ``Sigmoid``, ``ELU``, ``GELU`` or ``SiLU``
            as one layer with its activation fused after the bias
            (``layers.epilogues``); the results agree with the unfused
            layers' to rounding.  ``fused_pairs`` counts them.
    """

    def __init__(self, h, layers, loss, seed=0, input_grad=False, fuse=True):
        self.h = h
        self.layers = list(layers)
        self.loss = loss
        # before any layer is bound, so that a refused network changes none
        for _, path, layer in walk(self.layers):
            check_initialized(layer, f"Sequential: layer {path}")
        check_initialized(loss, "Sequential: the loss")
        for layer in self.layers + [loss]:
            layer.bind(h)
        #: how many (dense, activation) pairs run fused, in ``layers`` and
        #: in every ``Chain`` they hold
        self.fused_pairs = sum(fuse_layers(chain) for chain in self._chains()) if fuse else 0
        self.parameters = ParameterSet(h, self.layers, seed)
        #: (params, grads) of the compute format under mixed precision, else None
        self.compute = None
        #: the ``LossScaler`` of float16 mixed precision, else None
        self.loss_scaler = None
        #: None, or a callable that ``backward`` calls as ``backward_hook(i)``
        #: right after layer ``i``'s backward, when the gradients of layers
        #: ``i`` and after are complete (for later work on group 0): data
        #: parallel training starts the all-reduce of those gradients there.
        self.backward_hook = None
        if self.layers:
            self.layers[0].input_grad = input_grad

    def _chains(self):
        """The layer lists a network runs in order: its own, and each
        ``Chain``'s that it holds (``walk``)."""
        return [self.layers] + [layer.layers for _, _, layer in walk(self.layers)
                                if isinstance(layer, Chain)]

    def mixed_precision(self, dtype):
        """Compute in ``dtype`` (float16 or bfloat16) and keep the parameters
        in the network's own format as the master copy.

        The layers move to ``h.twin(dtype)`` (``self.h`` becomes it), with
        their parameters and gradients in half-format working buffers
        (``self.compute``), while ``parameters`` (and ``params``, ``grads``)
        stay the master copy, in float32 say, which the optimizer updates.
        Each forward pass first rounds the master parameters into the
        working copy (one ``cast_t``); ``train_step`` ends by carrying the
        half gradients into the master gradients (one ``cast_t``; none with
        ``master_grads=False``, for an optimizer that reads them itself), so
        the optimizer, its state and its update run in the master format.  In
        float16 a ``LossScaler`` (``self.loss_scaler``, its defaults) scales
        the loss gradient and unscales the master gradients, and the
        optimizer's step must go through it (``Trainer`` does).  Once per network: ValueError if
        called again or for a format that is not a half format.

        Indices stay exact, whatever few whole numbers ``dtype`` holds: the
        loss computes in float32 on the float32 twin and takes its targets
        there (``target_h``; class labels up to 2^24), and a first layer
        that takes indices (``Embedding``) takes them in the master format
        (``input_h``) and looks them up in the master parameters.  Feed
        inputs as arrays of ``input_h`` and targets of ``target_h``.
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
        # the master views, before compute_copies moves the layers' views
        masters = [dict(layer.params) for layer in self.layers]
        for layer in self.layers + [self.loss]:
            layer.bind(hc)
        self.compute = self.parameters.compute_copies(hc)
        self.h = hc
        for layer, views in zip(self.layers, masters):
            if getattr(layer, "takes_indices", False):
                layer.use_master(master, views)
        if dt == np.float16:   # 3 bits fewer of exponent than bfloat16: gradients underflow
            self.loss_scaler = LossScaler(self)

    # ------------------------------------------------------------------ state
    def state_dict(self):
        """Every parameter as a NumPy array (a host copy; waits for the
        device), named by its layer's position and class and its own name:
        ``{"0.LSTM.W": ..., "1.FullyConnected.W": ..., "1.FullyConnected.b":
        ...}``.  Under mixed precision these are the master parameters (in
        float32, say): the half working copy is derived from them."""
        return self.parameters.state_dict()

    def load_state_dict(self, state, cast=False):
        """Overwrite every parameter from ``state`` (a ``state_dict()``, of
        this network on any handler).  The names, shapes and formats are all
        checked first: ValueError naming the first missing, unexpected or
        mismatched entry, with nothing written.  A format that converts
        exactly (the same, or a wider float: a float32 state into a float64
        network) is accepted; one that would round (float32 into a bfloat16
        network) only with ``cast=True``."""
        self.parameters.loader(state, "Sequential.load_state_dict", cast)()

    def save(self, path):
        """Write ``state_dict()`` to the safetensors file ``path``
        (atomically; ``layers.checkpoint.save``)."""
        checkpoint.save(path, self.state_dict())

    def load(self, path, cast=False):
        """``load_state_dict`` from the safetensors file ``path``: a file of
        ``save``, or a ``Trainer.save`` checkpoint (its ``"net."`` part), so
        a run's checkpoint loads for inference on any handler."""
        state = checkpoint.load(path)
        if not any(name in state for name in self.parameters.names):
            inner = checkpoint.subset(state, "net.")
            state = inner if inner else state
        self.load_state_dict(state, cast)

    def __repr__(self):
        inner = ", ".join(repr(layer) for layer in self.layers)
        return f"Sequential([{inner}], loss={self.loss!r})"

    @property
    def input_h(self):
        """The handler whose arrays ``forward`` takes: ``h``, except under
        mixed precision when the first layer takes indices (``Embedding``:
        ``takes_indices``), which it takes in the master format, where they
        are exact (``parameters.h``)."""
        if self.compute is not None and self.layers \
                and getattr(self.layers[0], "takes_indices", False):
            return self.parameters.h
        return self.h

    @property
    def target_h(self):
        """The handler whose arrays the loss takes as targets: ``loss.h``,
        ``h`` itself for float32 and float64, the float32 twin for a half
        format (class labels stay exact)."""
        return self.loss.h

    @property
    def params(self):
        """The flat parameter buffer (a handler array)."""
        return self.parameters.params

    @property
    def grads(self):
        """The flat gradient buffer, same layout as ``params``."""
        return self.parameters.grads

    def refresh_working(self):
        """Under mixed precision, round the master parameters into the
        working copy (one ``cast_t``); nothing otherwise.  ``forward`` does
        so first unless told the copy is current."""
        if self.compute is not None:
            self.h.cast_t(self.parameters.params, self.compute[0])

    def forward(self, x, training=False, refresh=True):
        """Output of the last layer for input ``x`` (no loss).

        ``refresh=False``, under mixed precision: the working copy already
        holds the master parameters rounded (the last optimizer step wrote
        it: ``SGD.step(working=...)``), and the pass skips its cast.  Only
        a caller that knows nothing else changed the master parameters since
        may say so (``Trainer``: its steps' updates write the copy, and it
        refreshes it where anything else may have)."""
        if refresh:
            self.refresh_working()
        for layer in self.layers:
            x = layer.forward(x, training)
        return x

    def backward(self, dy):
        """Backpropagate dL/d(output) through the layers, writing every
        gradient; returns dL/dx if the first layer computes it, else None."""
        hook = self.backward_hook
        for i in range(len(self.layers) - 1, -1, -1):
            dy = self.layers[i].backward(dy)
            if hook is not None:
                hook(i)
        return dy

    def train_step(self, x, targets, master_grads=True, refresh=True):
        """Forward, loss and backward for one batch; the gradients are written
        into ``grads``.  ``x`` is an array of ``input_h``, ``targets`` of
        ``target_h``.  Returns the mean loss as a (1,) array of ``h`` (still
        on the device: nothing here waits for the device).

        ``master_grads=False``, under mixed precision: the gradients stay in
        the working copy (``compute[1]``), ``grads`` is not written (a pass
        over memory saved where the optimizer reads the half gradients
        itself: ``SGD.step(grads=...)``).  ValueError with a loss scaler,
        which unscales the master gradients.  ``refresh`` as ``forward``'s."""
        if not master_grads and self.loss_scaler is not None:
            raise ValueError("train_step: master_grads=False leaves nothing for the loss "
                             "scaler to unscale")
        loss = self.loss.forward(self.forward(x, training=True, refresh=refresh), targets)
        dy = self.loss.backward()
        if self.loss_scaler is not None:
            self.loss_scaler.scale(dy)
        self.backward(dy)
        if self.compute is not None and master_grads:   # into the master format
            self.parameters.h.cast_t(self.compute[1], self.parameters.grads)
        if self.loss_scaler is not None:
            self.loss_scaler.unscale(self.parameters.grads)
        return loss

    def evaluate_batch(self, x, targets):
        """Inference forward pass and loss: returns (loss array, output)."""
        y = self.forward(x, training=False)
        return self.loss.forward(y, targets, training=False), y
