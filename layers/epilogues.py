"""Epilogues: a dense layer's bias and activation as one op after its
product, and the pairs of layers a network runs that way.

``FullyConnected`` with ``activation`` set computes ``y = act(x @ W + b)``
as its product, then one fused op for ``act(z + b)``; its backward takes the
activation's derivative from ``y`` and reduces the bias gradient in one
fused op (``g = dy * act'``, ``db`` the sum of ``g`` over the rows), then its
two products.  Unfused, the same took three ops forward (product, bias,
activation) and four backward.  ``Sequential`` sets ``activation`` for a
``FullyConnected`` followed by a ``ReLU``, ``Tanh``, ``Sigmoid`` or ``ELU``
layer (``layers.network.fuse_layers``), which then passes its input through: the
user writes the layers as before.

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

def _declare(act):
    value, factor = FORMULAS[act]
    forward = fused_op(f"bias_{act}", inputs="z b:row", outputs="y",
                       body=f"s = z + b\ny = {value}\n")
    backward = fused_op(f"bias_{act}_backward", inputs="dy y", outputs="g db:row",
                        body=f"g = dy * ({factor})\ndb = g\n")
    return forward, backward


#: activation op -> (forward op (z, b, y), backward op (dy, y, g, db))
OPS = {act: _declare(act) for act in FORMULAS}
