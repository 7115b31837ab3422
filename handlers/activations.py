"""Activations as formulas: the one place an activation's arithmetic is
written.  The contract op ``dot_bias_act`` computes its epilogue from them
(``handlers.base.EPILOGUES``: NumpyHandler, and PyCudaHandler where cuBLASLt
does not run the product), and ``layers.epilogues`` builds the layers' fused
ops from them.  (Plain data: the op table's shape rules read
:data:`DOT_ACTS`, so this module imports nothing.)
"""
#: activation -> (y as a function of s, the derivative dy/ds, and what the
#: derivative reads: "y", the output, or "s", the input, which a fused layer
#: then keeps too).  Each text may start with statements, one a line; its
#: last line is the expression.  ReLU, tanh, sigmoid and ELU are the
#: contract ops' formulas (``relu``, ``relu_deriv``, ...); GELU is x * P(X <=
#: x) for a standard normal X ("gelu", with erf, PyTorch's default) or its
#: tanh approximation ("gelu_tanh", GPT-2's and cuBLASLt's epilogue's); SiLU
#: is x * sigmoid(x).
FORMULAS = {
    "relu": ("max(s, 0)", "y > 0", "y"),
    "tanh": ("tanh(s)", "1 - y * y", "y"),
    "sigmoid": ("sigmoid(s)", "(1 - y) * y", "y"),
    "elu": ("max(s, 0) + expm1(min(s, 0))", "where(y > 0, 1, y + 1)", "y"),
    "gelu": ("0.5 * s * (1 + erf(s * 0.7071067811865476))",
             "0.5 * (1 + erf(s * 0.7071067811865476)) "
             "+ s * exp(-0.5 * s * s) * 0.3989422804014327", "s"),
    "gelu_tanh": ("t = tanh(0.7978845608028654 * (s + 0.044715 * s ** 3))\n0.5 * s * (1 + t)",
                  "t = tanh(0.7978845608028654 * (s + 0.044715 * s ** 3))\n"
                  "0.5 * (1 + t) + 0.5 * s * (1 - t * t) * 0.7978845608028654 "
                  "* (1 + 0.134145 * s * s)", "s"),
    "silu": ("s * sigmoid(s)", "sigmoid(s) * (1 + s * (1 - sigmoid(s)))", "s"),
}


def split(text):
    """(the statements, the expression) of a formula's text."""
    *statements, expr = text.split("\n")
    return "".join(line + "\n" for line in statements), expr


def bias_body(act, keep=False):
    """The fused-op body y = act(z + b) (``act`` None: the bias alone), with
    ``keep`` also aux = z + b: ``dot_bias_act``'s epilogue and the layers'
    forward ops (``layers.epilogues``) are this one text."""
    if act is None:
        return "y = z + b\n"
    statements, value = split(FORMULAS[act][0])
    return f"s = z + b\n{statements}y = {value}\n" + ("aux = s\n" if keep else "")


#: The activations ``dot_bias_act`` takes: None (the bias alone) and those
#: cuBLASLt has an epilogue for (its GELU is the tanh approximation).
DOT_ACTS = (None, "relu", "gelu_tanh")
