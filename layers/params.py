"""Views into handler arrays, and the flat parameter and gradient buffers.

Every sub-array a layer uses (a weight inside the flat parameter buffer, the
gate of one time step inside an LSTM buffer) comes from ``view``, the one place
that knows how to make a view of a handler array; it calls the contract's
``view_t``.

Making a view costs host time (a ``GPUArray`` is a Python object), so layers
make their views once, when they allocate a buffer, never per step.
"""
import numpy as np

from .checkpoint import ArrayChecker, NoCopies

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


def walk(layers):
    """(position in ``layers``, path, layer) of every layer of ``layers`` and
    of the layers each holds (``Layer.children``), depth first, a holder
    before what it holds: the order of the flat buffers, so a top-level
    layer's parameters, its children's included, are one contiguous run.
    The path is the layer's position and class ("1.FullyConnected"),
    after its holder's path for a held one ("0.Residual.2.FullyConnected").
    ValueError for a layer that appears twice (two places cannot own one
    layer's parameter views)."""
    seen = set()

    def visit(top, prefix, i, layer):
        if id(layer) in seen:
            raise ValueError(f"{layer!r} appears twice in the network; a layer holds one "
                             f"set of parameters, so build one layer per place (to share "
                             f"weights, compute twice inside one layer of your own)")
        seen.add(id(layer))
        path = f"{prefix}{i}.{type(layer).__name__}"
        yield top, path, layer
        for j, child in enumerate(layer.children()):
            yield from visit(top, path + ".", j, child)

    for i, layer in enumerate(layers):
        yield from visit(i, "", i, layer)


class ParameterSet(NoCopies):
    """All parameters of some layers in one flat handler buffer, and all their
    gradients in another of the same size.

    Each layer gets views (``layer.params[name]``, ``layer.grads[name]``) into
    the two buffers, so an optimizer updates every parameter with a few ops on
    ``params`` and ``grads`` whatever the number of layers.  Initial values are
    drawn on the host by each layer's ``init_params`` from one seeded NumPy
    generator and uploaded in one copy.

    Args:
        h: the handler.
        layers: layers already bound to ``h`` (with the layers they hold:
            ``walk``).
        seed: seed of the initializers' generator.
    """

    def __init__(self, h, layers, seed=0):
        self.h = h
        walked = list(walk(layers))
        entries = [(layer, name, tuple(shape)) for _, _, layer in walked
                   for name, shape in layer.param_shapes().items()]
        offsets, total = layout([shape for _, _, shape in entries])
        self.size = total
        # A buffer of 0 elements is awkward on some backends; keep one element.
        self.params = h.zeros((max(total, 1),))
        self.grads = h.zeros((max(total, 1),))
        host = np.zeros(max(total, 1))
        #: (layer, name, offset, shape) of every parameter, in layer order
        self.entries = []
        #: the state-dict name of each entry: layer position, class, name
        #: ("1.FullyConnected.W"; a layer held by another continues its
        #: holder's path, "0.Residual.2.FullyConnected.W"), stable while the
        #: layers are
        self.names = []
        #: the position in ``layers`` of the layer holding each entry (the
        #: entry's own layer, or the container it sits in)
        self.owners = []
        where = {id(layer): (top, path) for top, path, layer in walked}
        for (layer, name, shape), off in zip(entries, offsets):
            layer.params[name] = view(h, self.params, off, shape)
            layer.grads[name] = view(h, self.grads, off, shape)
            self.entries.append((layer, name, off, shape))
            top, path = where[id(layer)]
            self.names.append(f"{path}.{name}")
            self.owners.append(top)
        rng = np.random.default_rng(seed)
        for _, _, layer in walked:
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

    # ------------------------------------------------------------------ state
    def split(self, flat, prefix=""):
        """{prefix + name: array} of a host copy ``flat`` of a buffer in this
        set's layout (the parameters, or an optimizer's per-parameter state),
        each its parameter's part (the padding left out), a view of ``flat``."""
        return {prefix + name: flat[off:off + int(np.prod(shape))].reshape(shape)
                for name, (_, _, off, shape) in zip(self.names, self.entries)}

    def join(self, checker, prefix=""):
        """The host buffer in this set's layout (format ``h.dtype``, the
        padding 0) from the arrays ``prefix + name`` of the state that
        ``checker`` (an ``ArrayChecker``) reads, each checked for its shape
        and format; ValueError naming the first that does not fit."""
        flat = np.zeros(self.params.shape, self.h.dtype)
        for name, (_, _, off, shape) in zip(self.names, self.entries):
            a = checker.array(prefix + name, shape, self.h.dtype)
            flat[off:off + int(np.prod(shape))] = a.reshape(-1)
        return flat

    def state_dict(self):
        """{name: NumPy array} of every parameter, in the set's format (one
        host read: waits for the device)."""
        return self.split(self.get())

    def loader(self, state, owner, cast=False):
        """Check ``state`` (``state_dict``'s names, shapes and formats; no
        other entries) and return a function that writes it, so that a
        caller can check several states before writing any."""
        checker = ArrayChecker(owner, state, cast)
        flat = self.join(checker)
        checker.done()
        return lambda: self.set(flat)

    def load_state_dict(self, state, cast=False):
        """Overwrite the parameters from ``state`` (see ``loader``); nothing
        is written unless all of it fits."""
        self.loader(state, "ParameterSet.load_state_dict", cast)()
