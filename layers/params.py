"""Views into handler arrays, and the flat parameter and gradient buffers.

Every sub-array a layer uses (a weight inside the flat parameter buffer, the
gate of one time step inside an LSTM buffer) comes from ``view``, the one place
that knows how to make a view of a handler array; it calls the contract's
``view_t``.

Making a view costs host time (a ``GPUArray`` is a Python object), so layers
make their views once, when they allocate a buffer, never per step.
"""
import numpy as np

#: Parameter offsets are rounded up to this many elements (256 bytes in
#: float32), so every parameter view starts on a boundary the vectorised
#: kernels and cuBLAS like.  The padding stays 0 in every buffer.
ALIGN = 64


def view(h, array, offset, shape):
    """A view of ``shape`` into the contiguous handler array ``array``, starting
    ``offset`` elements into its flattened data (``h.view_t``).  Writes through
    the view change ``array``.  ``h`` is the handler that owns ``array``."""
    return h.view_t(array, offset, tuple(int(s) for s in shape))


def index(h, array, i):
    """``array[i]``, the i-th sub-array along the first axis, as a view."""
    inner = array.shape[1:]
    n = int(np.prod(inner, dtype=np.int64))
    return view(h, array, i * n, inner)


def layout(shapes):
    """Offsets of parameters of the given shapes in one flat buffer.

    Returns (offsets, total size); each offset is a multiple of ``ALIGN``.
    """
    offsets, total = [], 0
    for shape in shapes:
        offsets.append(total)
        size = int(np.prod(shape, dtype=np.int64))
        total += -(-size // ALIGN) * ALIGN
    return offsets, total


class ParameterSet:
    """All parameters of some layers in one flat handler buffer, and all their
    gradients in another of the same size.

    Each layer gets views (``layer.params[name]``, ``layer.grads[name]``) into
    the two buffers, so an optimizer updates every parameter with a few ops on
    ``params`` and ``grads`` whatever the number of layers.  Initial values are
    drawn on the host by each layer's ``init_params`` from one seeded NumPy
    generator and uploaded in one copy.

    Args:
        h: the handler.
        layers: layers already bound to ``h``.
        seed: seed of the initializers' generator.
    """

    def __init__(self, h, layers, seed=0):
        self.h = h
        entries = [(layer, name, tuple(shape)) for layer in layers
                   for name, shape in layer.param_shapes().items()]
        offsets, total = layout([shape for _, _, shape in entries])
        self.size = total
        # A buffer of 0 elements is awkward on some backends; keep one element.
        self.params = h.zeros((max(total, 1),))
        self.grads = h.zeros((max(total, 1),))
        host = np.zeros(max(total, 1))
        #: (layer, name, offset, shape) of every parameter, in layer order
        self.entries = []
        for (layer, name, shape), off in zip(entries, offsets):
            layer.params[name] = view(h, self.params, off, shape)
            layer.grads[name] = view(h, self.grads, off, shape)
            self.entries.append((layer, name, off, shape))
        rng = np.random.default_rng(seed)
        for layer in layers:
            mine = {name: host[off:off + int(np.prod(shape))].reshape(shape)
                    for lay, name, off, shape in self.entries if lay is layer}
            if mine:
                layer.init_params(rng, mine)
        h.set_from_numpy(self.params, host)

    def compute_copies(self, hc):
        """Half-format working copies for mixed precision: new flat
        ``(params, grads)`` buffers of the twin handler ``hc``, in this set's
        layout, and every layer's ``params`` and ``grads`` views moved into
        them (the layers must already be bound to ``hc``).  This set's own
        buffers stay the master copy, which the optimizer updates."""
        size = self.params.shape[0]
        params, grads = hc.zeros((size,)), hc.zeros((size,))
        for layer, name, off, shape in self.entries:
            layer.params[name] = view(hc, params, off, shape)
            layer.grads[name] = view(hc, grads, off, shape)
        return params, grads

    @property
    def count(self):
        """Number of parameter elements (without the alignment padding)."""
        return sum(int(np.prod(shape)) for _, _, _, shape in self.entries)

    def get(self):
        """Host copy of the flat parameter buffer (blocks the host)."""
        return self.h.get_numpy_copy(self.params)

    def set(self, host):
        """Overwrite the flat parameter buffer from a host array of its shape."""
        self.h.set_from_numpy(self.params, host)
