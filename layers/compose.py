"""Layers that hold layers: ``Chain``, ``Residual`` and ``Graph``, with the
merges ``Add`` and ``Concat``.

A container is a layer like any other (``Layer``'s contract): it lists the
layers it holds in ``children()``, so the network binds them, lays their
parameters out in its one flat buffer (named after their place:
``"0.Residual.2.FullyConnected.W"``), fuses a dense layer with the
activation after it inside a ``Chain`` as it does in its own list, and the
optimizer, checkpoints, captures, mixed precision and data parallel see
nothing new.  Only the container's forward and backward are its own: it
calls its layers in order, and where one output feeds several layers, the
gradients they return for it add up.

Usage::

    from layers import FullyConnected, ReLU, Residual, Sequential, SoftmaxCrossEntropy

    block = Residual([FullyConnected(64, 64), ReLU(), FullyConnected(64, 64)])
    net = Sequential(h, [FullyConnected(10, 64), block, ReLU(), FullyConnected(64, 3)],
                     SoftmaxCrossEntropy())

A ``Graph`` connects named layers in any acyclic way, each naming its
inputs ("input" is the graph's own), with ``Add`` and ``Concat`` joining
branches.
"""
from .base import Layer


def _as_layer(block, owner):
    """``block`` itself if a ``Layer``, a ``Chain`` of it if a list or tuple
    of layers; TypeError naming ``owner`` otherwise."""
    if isinstance(block, Layer):
        return block
    if isinstance(block, (list, tuple)) and block and all(isinstance(b, Layer) for b in block):
        return Chain(block)
    raise TypeError(f"{owner}: the block must be a layer or a non-empty list of layers, "
                    f"got {block!r}")


class Chain(Layer):
    """Layers applied one after another, as a layer (``Sequential`` without
    its loss): to put a few layers where one is expected (the block of a
    ``Residual``, a node of a ``Graph``).  A dense or convolution layer
    followed by an activation inside it is fused as in ``Sequential``."""

    def __init__(self, layers):
        layers = list(layers)
        if not layers or not all(isinstance(x, Layer) for x in layers):
            raise TypeError(f"Chain: takes a non-empty list of layers, got {layers!r}")
        #: the layers, input side first
        self.layers = layers
        super().__init__()

    def __repr__(self):
        return f"Chain([{', '.join(repr(x) for x in self.layers)}])"

    def children(self):
        return tuple(self.layers)

    @property
    def input_grad(self):
        """Whether ``backward`` returns dL/dx: the first layer's flag."""
        return self.layers[0].input_grad

    @input_grad.setter
    def input_grad(self, value):
        self.layers[0].input_grad = value

    def forward(self, x, training=True):
        for layer in self.layers:
            x = layer.forward(x, training)
        return x

    def backward(self, dy):
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy


class Residual(Layer):
    """y = block(x) + x: a residual connection around ``block`` (a layer, or
    a list of layers, which becomes a ``Chain``), whose output must have
    x's shape.  The gradient of x is the block's plus dL/dy itself."""

    def __init__(self, block):
        #: the layer the connection goes around
        self.block = _as_layer(block, "Residual")
        super().__init__()

    def __repr__(self):
        return f"Residual({self.block!r})"

    def children(self):
        return (self.block,)

    def forward(self, x, training=True):
        fx = self.block.forward(x, training)
        if tuple(fx.shape) != tuple(x.shape):
            raise ValueError(f"{self!r}: the block maps shape {tuple(x.shape)} to "
                             f"{tuple(fx.shape)}; a residual connection needs the same shape")
        y = self.buffers(("y", tuple(x.shape)), y=x.shape).y
        self.h.add_tt(fx, x, y)
        return y

    def backward(self, dy):
        # the block's first layer skips dL/dx when nobody needs it
        self.block.input_grad = self.input_grad
        dfx = self.block.backward(dy)
        if not self.input_grad:
            return None
        dx = self.buffers(("dx", tuple(dy.shape)), dx=dy.shape).dx
        self.h.add_tt(dfx, dy, dx)
        return dx


class Merge(Layer):
    """A layer of several inputs (``Graph`` gives it a list): ``forward(xs,
    training)`` takes the list, ``backward(dy)`` returns the list of their
    gradients, in the same order."""

    def forward(self, xs, training=True):
        raise NotImplementedError

    def backward(self, dy):
        raise NotImplementedError


class Add(Merge):
    """y = x_0 + x_1 + ...: inputs of one shape."""

    def forward(self, xs, training=True):
        shapes = {tuple(x.shape) for x in xs}
        if len(xs) < 2 or len(shapes) != 1:
            raise ValueError(f"{self!r}: takes two or more inputs of one shape, got shapes "
                             f"{[tuple(x.shape) for x in xs]}")
        self._n = len(xs)
        y = self.buffers(("y", tuple(xs[0].shape)), y=xs[0].shape).y
        self.h.add_tt(xs[0], xs[1], y)
        for x in xs[2:]:
            self.h.add_tt(y, x, y)
        return y

    def backward(self, dy):
        # every input's gradient is dy itself (read-only to the caller)
        return [dy] * self._n


class Concat(Merge):
    """y = the inputs joined along their last axis (``concat_t``): shapes
    equal but along it."""

    def forward(self, xs, training=True):
        if len(xs) < 2:
            raise ValueError(f"{self!r}: takes two or more inputs, got {len(xs)}")
        lead = {tuple(x.shape[:-1]) for x in xs}
        if len(lead) != 1:
            raise ValueError(f"{self!r}: the inputs must agree but along the last axis, got "
                             f"shapes {[tuple(x.shape) for x in xs]}")
        self._widths = [x.shape[-1] for x in xs]
        y = xs[0]
        for i, x in enumerate(xs[1:], 1):
            shape = tuple(x.shape[:-1]) + (sum(self._widths[:i + 1]),)
            out = self.buffers(("y", i, shape), y=shape).y
            self.h.concat_t(y, x, -1, out)
            y = out
        return y

    def backward(self, dy):
        lead, grads = tuple(dy.shape[:-1]), []
        rest = dy
        for i in range(len(self._widths) - 1, 0, -1):
            head = lead + (sum(self._widths[:i]),)
            b = self.buffers(("dx", i, head), head=head, tail=lead + (self._widths[i],))
            self.h.split_t(rest, -1, b.head, b.tail)
            grads.append(b.tail)
            rest = b.head
        grads.append(rest)
        return grads[::-1]


class Graph(Layer):
    """Named layers connected in any acyclic way, as a layer.

    ``nodes`` is a list of ``(name, layer, inputs)`` in an order where every
    input is defined before it is used: ``inputs`` names one earlier node,
    or ``"input"`` (the graph's input), or for a ``Merge`` (``Add``,
    ``Concat``) a list of such names.  The graph's output is the node
    ``output`` (default: the last).  A node's output may feed several
    nodes: their gradients for it add up.  Every node must lead to the
    output (a node that does not would get no gradient): ValueError.
    """

    INPUT = "input"

    def __init__(self, nodes, output=None):
        self.nodes = []
        known = {self.INPUT}
        for entry in nodes:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 3):
                raise TypeError(f"Graph: each node is (name, layer, inputs), got {entry!r}")
            name, layer, inputs = entry
            layer = _as_layer(layer, f"Graph node {name!r}")
            many = isinstance(layer, Merge)
            ins = [inputs] if isinstance(inputs, str) else list(inputs)
            if not isinstance(name, str) or name in known:
                raise ValueError(f"Graph: node names must be new strings other than "
                                 f"{self.INPUT!r}, got {name!r}")
            if (len(ins) != 1) != many or not ins:
                raise ValueError(f"Graph node {name!r}: a merge (Add, Concat) takes a list of "
                                 f"two or more inputs, any other layer one name; got "
                                 f"{type(layer).__name__} with {inputs!r}")
            for i in ins:
                if i not in known:
                    raise ValueError(f"Graph node {name!r}: input {i!r} is not an earlier node "
                                     f"or {self.INPUT!r}")
            self.nodes.append((name, layer, tuple(ins)))
            known.add(name)
        if not self.nodes:
            raise ValueError("Graph: needs at least one node")
        self.output = self.nodes[-1][0] if output is None else output
        if self.output not in known - {self.INPUT}:
            raise ValueError(f"Graph: output {self.output!r} is not a node")
        reaching = {self.output}
        for name, _, ins in reversed(self.nodes):
            if name in reaching:
                reaching.update(ins)
        dead = [name for name, *_ in self.nodes if name not in reaching]
        if dead:
            raise ValueError(f"Graph: nodes {dead} do not lead to the output {self.output!r}")
        super().__init__()

    def __repr__(self):
        inner = ", ".join(f"({name!r}, {layer!r}, "
                          f"{list(ins) if isinstance(layer, Merge) else ins[0]!r})"
                          for name, layer, ins in self.nodes)
        return f"Graph([{inner}], output={self.output!r})"

    def children(self):
        return tuple(layer for _, layer, _ in self.nodes)

    def forward(self, x, training=True):
        values = {self.INPUT: x}
        for name, layer, ins in self.nodes:
            if isinstance(layer, Merge):
                values[name] = layer.forward([values[i] for i in ins], training)
            else:
                values[name] = layer.forward(values[ins[0]], training)
        return values[self.output]

    def backward(self, dy):
        grads = {self.output: dy}
        for name, layer, ins in reversed(self.nodes):
            g = grads.pop(name)
            # only the layers reading the graph's input may skip its gradient
            layer.input_grad = self.input_grad or self.INPUT not in ins
            dxs = layer.backward(g)
            if not isinstance(layer, Merge):
                dxs = [dxs]
            for i, dx in zip(ins, dxs):
                if i == self.INPUT and not self.input_grad:
                    continue
                if i not in grads:
                    grads[i] = dx
                    continue
                # a second path to i: the sum into our own buffer, never
                # into an array a layer owns
                total = self.buffers(("sum", i, tuple(dx.shape)), g=dx.shape).g
                self.h.add_tt(grads[i], dx, total)
                grads[i] = total
        return grads.get(self.INPUT) if self.input_grad else None
