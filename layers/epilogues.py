"""Epilogues: a dense or convolution layer's bias and activation as one op
after its product, and the pairs of layers a network runs that way.

``FullyConnected`` with ``activation`` set computes ``y = act(x @ W + b)``
as its product, then one fused op for ``act(z + b)`` (with no activation
or ReLU, the whole forward is one ``dot_bias_act``, and ``Conv2D``'s one
``conv2d_bias_act``: :data:`ONE_OP`); its backward takes the
activation's derivative from ``y`` and reduces the bias gradient in one
fused op (``g = dy * act'``, ``db`` the sum of ``g`` over the rows), then its
two products.  Unfused, the same took three ops forward (product, bias,
activation) and four backward.  ``Conv2D`` does the same over its output's
(image, channel) planes, the bias gradient summed along each plane in the
op and then over the images.  ``Sequential`` sets ``activation`` for a
``FullyConnected`` or ``Conv2D`` followed by a ``ReLU``, ``Tanh``,
``Sigmoid`` or ``ELU`` layer (``layers.network.fuse_layers``), which then
passes its input through: the user writes the layers as before.

Each formula of an activation with a contract op is that op's (``relu``,
``tanh``, ``sigmoid``, ``elu`` and their ``*_deriv``), the derivative
written in terms of the output, which decides the same cases as the input
does (``y > 0`` exactly where ``x > 0`` for ReLU and ELU).  GELU and SiLU
have no contract op: their layers run the same formulas as fused ops, and
their derivatives read the input, which a fused layer keeps (``aux``).
"""
from handlers import fused_op
from handlers.activations import DOT_ACTS, FORMULAS, bias_body
from handlers.activations import split as _split
from handlers.base import CONV_EPILOGUES, EPILOGUES


def _declare(act, bias):
    """The forward and backward ops of ``act`` after a bias that is a row
    over the last axis (``bias`` "row": a dense layer's) or one value per
    row (``bias`` "col": a convolution's per-channel bias, each (image,
    channel) plane a row); the backward sums the bias gradient the same way
    (over the rows, or along each row).  Where the derivative reads s, the
    forward op also writes s into ``aux`` and the backward reads it there."""
    (ds, factor), reads = _split(FORMULAS[act][1]), FORMULAS[act][2]
    kind = "" if bias == "row" else "conv_"
    keep = reads == "s"
    if act in ONE_OP:   # the ops' own epilogue: one program
        forward = (EPILOGUES if bias == "row" else CONV_EPILOGUES)[act]
    else:
        forward = fused_op(f"{kind}bias_{act}", inputs=f"z b:{bias}",
                           outputs="y aux" if keep else "y", body=bias_body(act, keep))
    backward = fused_op(f"{kind}bias_{act}_backward", inputs=f"dy {reads}",
                        outputs=f"g db:{bias}",
                        body=f"{ds}g = dy * ({factor})\n"
                             f"db = {'g' if bias == 'row' else 'sum(g)'}\n")
    return forward, backward


def _declare_layer(act):
    """The forward (x, y) and backward (dy, x, dx) ops of an activation
    layer computed by fused ops alone (those whose derivative reads s)."""
    (vs, value), (ds, factor) = _split(FORMULAS[act][0]), _split(FORMULAS[act][1])
    return (fused_op(act, inputs="x", outputs="y", body=f"s = x\n{vs}y = {value}\n"),
            fused_op(f"{act}_backward", inputs="dy s", outputs="dx",
                     body=f"{ds}dx = dy * ({factor})\n"))


def check_activation(owner, activation):
    """``activation`` if it is None or a name of :data:`FORMULAS`, else
    ValueError naming ``owner`` (a layer's constructor)."""
    if activation is not None and activation not in FORMULAS:
        raise ValueError(f"{owner}: activation must be None or one of {sorted(FORMULAS)}, "
                         f"got {activation!r}")
    return activation


def repr_part(layer):
    """", activation=..." for a layer's repr where it was asked for the
    activation itself, "" where it has none or ``Sequential`` paired it with
    the next layer (whose repr shows it)."""
    return f", activation={layer.activation!r}" if layer.activation and not layer.paired else ""


def keeps_input(act):
    """Whether a layer fused with ``act`` keeps the activation's input (the
    ``aux`` output of its forward op) for the backward."""
    return FORMULAS[act][2] == "s"


#: The activations whose dense or convolution layer runs its forward as one
#: op (``dot_bias_act``, ``conv2d_bias_act``): None and those of the ops
#: whose derivative reads the output (GELU's needs z + b, which the ops do
#: not keep).
ONE_OP = tuple(a for a in DOT_ACTS if a is None or not keeps_input(a))
#: activation op -> (forward op (z, b, y[, aux]), backward op (dy, y or aux,
#: g, db)) of a dense layer: b and db rows (1, n_out)
OPS = {act: _declare(act, "row") for act in FORMULAS}
#: the same for a convolution, over (N * K, P * Q) views of its NCHW output:
#: b and db one value per row, (N * K, 1)
CONV_OPS = {act: _declare(act, "col") for act in FORMULAS}
#: activation -> (forward op (x, y), backward op (dy, x, dx)) of the
#: activation layers with no contract op (GELU, SiLU)
LAYER_OPS = {act: _declare_layer(act) for act in FORMULAS if keeps_input(act)}
