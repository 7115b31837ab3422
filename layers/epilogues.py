"""Epilogues: a dense or convolution layer's bias and activation as one op
after its product, and the pairs of layers a network runs that way.

``FullyConnected`` with ``activation`` set computes ``y = act(x @ W + b)``
as its product, then one fused op for ``act(z + b)``; its backward takes the
activation's derivative from ``y`` and reduces the bias gradient in one
fused op (``g = dy * act'``, ``db`` the sum of ``g`` over the rows), then its
two products.  Unfused, the same took three ops forward (product, bias,
activation) and four backward.  ``Conv2D`` does the same over its output's
(image, channel) planes, the bias gradient summed along each plane in the
op and then over the images.  ``Sequential`` sets ``activation`` for a
``FullyConnected`` or ``Conv2D`` followed by a ``ReLU``, ``Tanh``,
``Sigmoid`` or ``ELU`` layer (``layers.network.fuse_layers``), which then
passes its input through: the user writes the layers as before.

Each formula is the contract op's (``relu``, ``tanh``, ``sigmoid``, ``elu``
and their ``*_deriv``), the derivative written in terms of the output, which
decides the same cases as the input does (``y > 0`` exactly where ``x > 0``
for ReLU and ELU).
"""
from handlers import fused_op

#: activation op -> (its value at s = z + b, its derivative as a factor of y)
FORMULAS = {
    "relu": ("max(s, 0)", "y > 0"),
    "tanh": ("tanh(s)", "1 - y * y"),
    "sigmoid": ("sigmoid(s)", "(1 - y) * y"),
    "elu": ("max(s, 0) + expm1(min(s, 0))", "where(y > 0, 1, y + 1)"),
}

def _declare(act, bias):
    """The forward and backward ops of ``act`` after a bias that is a row
    over the last axis (``bias`` "row": a dense layer's) or one value per
    row (``bias`` "col": a convolution's per-channel bias, each (image,
    channel) plane a row); the backward sums the bias gradient the same way
    (over the rows, or along each row)."""
    value, factor = FORMULAS[act]
    kind = "" if bias == "row" else "conv_"
    forward = fused_op(f"{kind}bias_{act}", inputs=f"z b:{bias}", outputs="y",
                       body=f"s = z + b\ny = {value}\n")
    backward = fused_op(f"{kind}bias_{act}_backward", inputs="dy y", outputs=f"g db:{bias}",
                        body=f"g = dy * ({factor})\ndb = {'g' if bias == 'row' else 'sum(g)'}\n")
    return forward, backward


#: activation op -> (forward op (z, b, y), backward op (dy, y, g, db)) of a
#: dense layer: b and db rows (1, n_out)
OPS = {act: _declare(act, "row") for act in FORMULAS}
#: the same for a convolution, over (N * K, P * Q) views of its NCHW output:
#: b and db one value per row, (N * K, 1)
CONV_OPS = {act: _declare(act, "col") for act in FORMULAS}
