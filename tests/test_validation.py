"""Bad input to every op: the exact exception, a message naming the op, and no
array touched.

Each op is described once in ``OPS`` by its arguments, in call order, with
valid shapes.  The bad cases are derived from that description (wrong array
type, wrong dtype, non-contiguous view, bad scalars for every argument; wrong
shapes and ranks where listed) plus per-op extras (bad axis, forbidden
aliasing, out-of-range parameters).  ``test_valid_call`` checks that the
undamaged call succeeds, so that each bad case fails for its own reason.  A
case may add ``"match"``: regular expressions the message must contain (the
problem named, beyond the op).
"""
import math
import re
import threading
import time

import numpy as np
import pytest

from handlers import CaptureError, Handler, NumpyHandler, fused, fused_op
from handlers.optable import ELEMENTWISE, PUBLIC
from helpers import other_dtype, rand

Q4, K4, L3 = (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 4)   # attention's q, k and v, lse
SH = (3, 4)          # default shape of same-shape ops
OTHER = (3, 5)       # a wrong shape for them
FLAT = (12,)         # a wrong rank, same size


# ---------------------------------------------------------------- op descriptions
class Arr:
    """A handler array argument (random contents); ``any_format``: the op
    takes it in any format its handler class holds (cast_t's source)."""
    def __init__(self, name, shape, values=None, any_format=False):
        self.name, self.shape, self.values = name, shape, values
        self.any_format = any_format


class Host:
    """A NumPy host array argument (create_from_numpy, set_from_numpy)."""
    def __init__(self, name, shape):
        self.name, self.shape = name, shape


class Scalar:
    """A real scalar argument, validated by the op."""
    def __init__(self, name, value):
        self.name, self.value = name, value


class Fixed:
    """Any other argument (axis, flags, shapes, handler views)."""
    def __init__(self, name, value):
        self.name, self.value = name, value


class Op:
    def __init__(self, name, *params, same_shape=False, bad_shapes=(), bad_ranks=(),
                 extra=()):
        self.name, self.params = name, params
        arrays = [p.name for p in params if isinstance(p, Arr)]
        if same_shape:  # every array argument must have the one shape SH
            bad_shapes = [(a, OTHER) for a in arrays]
            bad_ranks = [(a, FLAT) for a in arrays]
        self.bad_shapes, self.bad_ranks, self.extra = bad_shapes, bad_ranks, extra


def index_values(cols):
    """Valid class indices stored as floats, for index_m_by_v and binarize_v."""
    return lambda shape, rng: rng.integers(0, cols, shape).astype(float)


def positive(shape, rng):
    """Values in [0.1, 2): Adam's second moment and step count are >= 0."""
    return rand(shape, rng, 0.1, 2.0)


def cond_values(shape, rng):
    return (rng.random(shape) < 0.5).astype(float)


def mv(name):
    return Op(name, Arr("m", SH), Arr("v", (1, 4)), Arr("out", SH),
              bad_shapes=[("v", (1, 5)), ("v", (4, 1)), ("v", SH), ("out", OTHER), ("m", OTHER)],
              bad_ranks=[("v", (4,)), ("m", FLAT), ("out", FLAT)])


def dot(name):
    return Op(name, Arr("a", (3, 4)), Arr("b", (4, 5)), Arr("out", (3, 5)),
              Fixed("transa", False), Fixed("transb", False),
              bad_shapes=[("a", (3, 6)), ("b", (5, 5)), ("out", (3, 4)), ("out", (5, 3))],
              bad_ranks=[("a", (3, 4, 1)), ("b", (20,)), ("out", (15,))],
              extra=[("transa-mismatch", ValueError, {"transa": True}),
                     ("transb-mismatch", ValueError, {"transb": True}),
                     ("out-is-a", ValueError, {"shapes": {"a": (3, 3), "b": (3, 3), "out": (3, 3)},
                                               "alias": {"out": "a"}}),
                     ("out-is-b", ValueError, {"shapes": {"a": (3, 3), "b": (3, 3), "out": (3, 3)},
                                               "alias": {"out": "b"}}),
                     ("out-overlaps-a", ValueError, {"shapes": {"b": (4, 4), "out": (3, 4)},
                                                     "overlap": ("a", "out", (4, 4))})])


def shape_arg_op(name):
    def bad(value, exc):
        return f"shape={value!r}", exc, {"shape": value}
    def huge(shape):   # more bytes than any array can hold (2**63 - 1)
        return (f"shape={shape!r}", ValueError,
                {"shape": shape, "match": [re.escape(str(shape)), r"\d+ bytes"]})
    return Op(name, Fixed("shape", SH),
              extra=[bad(-1, ValueError), bad((3, -1), ValueError), bad(None, TypeError),
                     bad(2.5, TypeError), bad("ab", TypeError), bad((2.5, 3), TypeError),
                     huge((2**62,)), huge((2**61,)), huge((2**40, 2**40)), huge(2**64),
                     huge((2**31, 2**31, 4))])


class NotAnArray:
    """Looks like an ndarray (shape, dtype, flags) but is not one."""
    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.size, self.ndim = shape, np.dtype(dtype), 0, len(shape)

        class Flags:
            c_contiguous = True
        self.flags = Flags()

    def __array__(self, dtype=None, copy=None):
        return np.zeros(self.shape, dtype or self.dtype)


X4, W4, Y4, P4 = (2, 3, 5, 6), (4, 3, 3, 2), (2, 4, 3, 5), (2, 3, 2, 3)


def conv(name, arrays):
    """A conv2d op: its three NCHW arrays (name, shape), stride, padding,
    dilation; the first two arrays are the inputs, the last the output."""
    (i1, s1), (i2, s2), (o, so) = arrays
    wrong = {X4: (2, 3, 5, 7), W4: (4, 2, 3, 2), Y4: (2, 4, 3, 4)}   # one dim off each
    return Op(name, *[Arr(n, sh) for n, sh in arrays], Fixed("stride", 1), Fixed("padding", 0),
              Fixed("dilation", 1),
              bad_shapes=[(n, wrong[sh]) for n, sh in arrays] + [(o, so[:3] + (so[3] + 1,))],
              bad_ranks=[(n, sh[:2] + (sh[2] * sh[3],)) for n, sh in arrays],
              extra=[("stride=0", ValueError, {"stride": 0}),
                     ("stride=(1,-1)", ValueError, {"stride": (1, -1)}),
                     ("dilation=0", ValueError, {"dilation": 0}),
                     ("padding=-1", ValueError, {"padding": -1}),
                     ("stride=1.0", TypeError, {"stride": 1.0}),
                     ("padding=(1,2,3)", TypeError, {"padding": (1, 2, 3)}),
                     ("dilation=True", TypeError, {"dilation": True}),
                     ("padding-changes-size", ValueError, {"padding": 1}),
                     ("no-output", ValueError, {"dilation": 3}),
                     *[(f"{o}-overlaps-{i}", ValueError,
                        {"overlap": (i, o, (max(math.prod(si), math.prod(so)) + 1,))})
                       for i, si in ((i1, s1), (i2, s2))],
                     *_empty_conv_cases(arrays)])


def _empty_conv_cases(arrays):
    """No samples, no channels, no filters: each refused, naming what is empty."""
    def zero(shape, axis):
        return shape[:axis] + (0,) + shape[axis + 1:]
    batch = {n: zero(sh, 0) for n, sh in arrays if sh != W4}
    channels = {n: zero(sh, 1) for n, sh in arrays if sh != Y4}
    filters = {n: zero(sh, 0 if sh == W4 else 1) for n, sh in arrays if sh != X4}
    return [("batch=0", ValueError, {"shapes": batch, "match": ["batch", r"\b0\b"]}),
            ("channels=0", ValueError, {"shapes": channels, "match": ["channels", r"\b0\b"]}),
            ("filters=0", ValueError, {"shapes": filters, "match": ["filters", r"\b0\b"]})]


def argmax_values(shape, rng):
    """Indices within a 2x2 window (the pool ops' window here), as floats."""
    return rng.integers(0, 4, shape).astype(float)


def pool(name, arrays, extra):
    """A pooling op with window 2 (stride 2, no padding): (name, shape[,
    values]) per array, inputs first."""
    outputs = {"out", "argmax", "dx"}
    first_in = next(a[0] for a in arrays if a[0] not in outputs)
    out = next(a[0] for a in arrays if a[0] in outputs and a[0] != "argmax")
    big = "dx" if name.endswith("backward") else "x"
    return Op(name, *[Arr(*a) for a in arrays], Fixed("window", 2), Fixed("stride", None),
              Fixed("padding", 0),
              bad_shapes=[(a[0], (2, 3, 3, 3) if a[1] == P4 else (2, 4, 5, 6)) for a in arrays],
              bad_ranks=[(a[0], a[1][1:]) for a in arrays],
              extra=[("window=0", ValueError, {"window": 0}),
                     ("window=(2,2.0)", TypeError, {"window": (2, 2.0)}),
                     ("window=None", TypeError, {"window": None}),
                     ("stride=0", ValueError, {"stride": 0}),
                     ("padding=-1", ValueError, {"padding": -1}),
                     ("padding=window", ValueError, {"padding": 2}),
                     ("stride-changes-size", ValueError, {"stride": 1}),
                     ("window-too-big", ValueError, {"window": (6, 2),
                                                     "shapes": {big: (2, 3, 5, 4)}}),
                     (f"{out}-overlaps-{first_in}", ValueError,
                      {"overlap": (first_in, out, (200,))}),
                     ("batch=0", ValueError, {"shapes": {a[0]: (0,) + a[1][1:] for a in arrays},
                                              "match": ["batch", r"\b0\b"]}),
                     ("channels=0", ValueError,
                      {"shapes": {a[0]: a[1][:1] + (0,) + a[1][2:] for a in arrays},
                       "match": ["channels", r"\b0\b"]}), *extra])


SCALAR_VALUES = {"a_min": -0.5, "a_max": 0.5}
NAN, INF = float("nan"), float("inf")
EXTRA = {"clip_t": [("a_min>a_max", ValueError, {"a_min": 0.6, "a_max": 0.5}),
                    ("a_min=nan", ValueError, {"a_min": NAN, "match": ["a_min", "nan"]}),
                    ("a_max=nan", ValueError, {"a_max": NAN, "match": ["a_max", "nan"]}),
                    ("both-nan", ValueError, {"a_min": NAN, "a_max": NAN, "match": "nan"})]}


def elementwise(row):
    """The description of an elementwise row of the op table."""
    params = [Scalar(p, SCALAR_VALUES.get(p, 0.5)) if p in row.scalars
              else Arr(p, SH, cond_values if p == "cond" else None) for p in row.params]
    return Op(row.name, *params, same_shape=True, extra=EXTRA.get(row.name, []))


OPS = [
    # memory
    shape_arg_op("allocate"), shape_arg_op("zeros"), shape_arg_op("ones"),
    Op("create_from_numpy", Host("arr", SH)),
    Op("get_numpy_copy", Arr("a", SH)),
    Op("set_from_numpy", Arr("a", SH), Host("arr", SH), bad_shapes=[("arr", OTHER)],
       bad_ranks=[("arr", FLAT)]),
    Op("copy_to", Arr("src", SH), Arr("dest", SH), same_shape=True),
    Op("cast_t", Arr("src", SH, any_format=True), Arr("dst", SH), same_shape=True,
       extra=[("dst-is-src", ValueError, {"alias": {"dst": "src"}}),
              ("dst-overlaps-src", ValueError, {"overlap": ("src", "dst", (20,))})]),
    Op("reshape_t", Arr("a", SH), Fixed("shape", (2, -1)),
       extra=[("shape=(5,3)", ValueError, {"shape": (5, 3)}),
              ("shape=(-1,-1)", ValueError, {"shape": (-1, -1)}),
              ("shape=(5,-1)", ValueError, {"shape": (5, -1)}),
              ("shape=1.5", TypeError, {"shape": 1.5}),
              ("shape=(2,True,6)", TypeError, {"shape": (2, True, 6)})]),
    Op("view_t", Arr("a", SH), Fixed("offset", 2), Fixed("shape", (2, 5)),
       extra=[("past-the-end", ValueError, {"offset": 3}),
              ("offset=-1", ValueError, {"offset": -1}),
              ("offset=1.0", TypeError, {"offset": 1.0}),
              ("offset=True", TypeError, {"offset": True}),
              ("shape=(-2,)", ValueError, {"shape": (-2,)})]),
    Op("fill", Arr("a", SH), Scalar("value", 0.5)),
    # BLAS
    dot("dot_mm"), dot("dot_add_mm"),
    Op("dot_bias_act", Arr("a", (3, 4)), Arr("b", (4, 5)), Arr("bias", (1, 5)),
       Arr("out", (3, 5)), Fixed("act", "relu"),
       bad_shapes=[("a", (3, 6)), ("b", (5, 5)), ("bias", (5, 1)), ("bias", (1, 4)),
                   ("out", (3, 4)), ("out", (5, 3))],
       bad_ranks=[("a", (3, 4, 1)), ("bias", (5,)), ("out", (15,))],
       extra=[("act=tanh", ValueError, {"act": "tanh", "match": ["act", "tanh"]}),
              ("act=1", ValueError, {"act": 1}),
              ("out-is-a", ValueError, {"shapes": {"a": (3, 3), "b": (3, 3), "bias": (1, 3),
                                                   "out": (3, 3)}, "alias": {"out": "a"}}),
              ("out-is-b", ValueError, {"shapes": {"a": (3, 3), "b": (3, 3), "bias": (1, 3),
                                                   "out": (3, 3)}, "alias": {"out": "b"}}),
              ("out-is-bias", ValueError, {"shapes": {"a": (1, 4), "out": (1, 5)},
                                           "alias": {"out": "bias"}})]),
    Op("axpby", Scalar("alpha", 0.5), Arr("x", SH), Scalar("beta", 2.0), Arr("y", SH),
       same_shape=True),
    Op("adam_update", Arr("g", SH), Scalar("lr", 0.01), Scalar("beta1", 0.9),
       Scalar("beta2", 0.999), Scalar("eps", 1e-8), Scalar("weight_decay", 0.1),
       Arr("step", (1,), positive), Arr("m", SH), Arr("v", SH, positive), Arr("p", SH),
       Fixed("decoupled", False),
       bad_shapes=[("g", OTHER), ("m", OTHER), ("v", OTHER), ("p", OTHER), ("step", (2,))],
       bad_ranks=[("p", FLAT), ("g", FLAT)],
       extra=[("lr<0", ValueError, {"lr": -0.1}), ("beta1=1", ValueError, {"beta1": 1.0}),
              ("beta2<0", ValueError, {"beta2": -0.5}), ("eps=0", ValueError, {"eps": 0.0}),
              ("weight_decay<0", ValueError, {"weight_decay": -1.0}),
              ("decoupled=1", TypeError, {"decoupled": 1}),
              ("p-is-g", ValueError, {"alias": {"p": "g"}}),
              ("m-is-v", ValueError, {"alias": {"m": "v"}}),
              ("gate=nan", ValueError, {"gate": NAN}),
              ("gate=inf", ValueError, {"gate": INF, "match": ["gate", "inf"]}),
              ("lr=nan", ValueError, {"lr": NAN, "match": ["lr", "nan"]}),
              ("lr=inf", ValueError, {"lr": INF, "match": ["lr", "inf"]}),
              ("lr=-inf", ValueError, {"lr": -INF, "match": ["lr", "-inf"]}),
              ("beta1=nan", ValueError, {"beta1": NAN, "match": ["beta1", "nan"]}),
              ("beta2=nan", ValueError, {"beta2": NAN, "match": ["beta2", "nan"]}),
              ("eps=nan", ValueError, {"eps": NAN, "match": ["eps", "nan"]}),
              ("eps=inf", ValueError, {"eps": INF, "match": ["eps", "inf"]}),
              ("weight_decay=nan", ValueError, {"weight_decay": NAN,
                                                "match": ["weight_decay", "nan"]}),
              ("weight_decay=inf", ValueError, {"weight_decay": INF,
                                                "match": ["weight_decay", "inf"]})]),
    Op("scale_finite_t", Arr("a", SH), Scalar("factor", 0.5), Arr("flag", (1,)),
       bad_shapes=[("flag", (2,))],
       extra=[("factor=nan", ValueError, {"factor": NAN, "match": ["factor", "nan"]}),
              ("factor=inf", ValueError, {"factor": INF, "match": ["factor", "inf"]}),
              ("factor=-inf", ValueError, {"factor": -INF, "match": ["factor", "-inf"]})]),
    Op("update_loss_scale", Arr("flag", (1,)), Arr("state", (4,), positive),
       Scalar("interval", 2.0), Scalar("max_scale", 1024.0),
       bad_shapes=[("flag", (2,)), ("state", (3,)), ("state", (2, 2))],
       extra=[("interval=0", ValueError, {"interval": 0.0}),
              ("interval=1.5", ValueError, {"interval": 1.5}),
              ("interval=nan", ValueError, {"interval": NAN, "match": ["interval", "nan"]}),
              ("interval=inf", ValueError, {"interval": INF, "match": ["interval", "inf"]}),
              ("interval=-inf", ValueError, {"interval": -INF, "match": ["interval", "inf"]}),
              ("max_scale=0", ValueError, {"max_scale": 0.0}),
              ("max_scale=nan", ValueError, {"max_scale": NAN, "match": ["max_scale", "nan"]}),
              ("max_scale=inf", ValueError, {"max_scale": INF,
                                             "match": ["max_scale", "inf"]})]),
    # reduction
    Op("sum_t", Arr("a", (3, 4, 5)), Fixed("axis", 1), Arr("out", (3, 5)),
       bad_shapes=[("out", (3, 4)), ("out", (4, 5)), ("a", (3, 4, 6))],
       bad_ranks=[("a", (3, 4, 5, 1)), ("out", (15,)), ("out", (3, 1, 5, 1))],
       extra=[("axis=3", ValueError, {"axis": 3}), ("axis=-4", ValueError, {"axis": -4}),
              ("axis=1.0", TypeError, {"axis": 1.0}), ("axis='1'", TypeError, {"axis": "1"}),
              ("axis=None-out-too-big", ValueError, {"axis": None, "shapes": {"out": (2,)}}),
              ("rank-0", ValueError, {"axis": None, "shapes": {"a": (), "out": ()}}),
              ("out-is-a", ValueError, {"shapes": {"a": (3, 1), "out": (3, 1)},
                                        "alias": {"out": "a"}}),
              ("out-view-of-a", ValueError, {"shapes": {"a": (3, 1)},
                                             "view": ("out", "a", (3,))})]),
    Op("sum_t-axes", Arr("a", (3, 4, 5)), Fixed("axis", (0, 2)), Arr("out", (4,)),
       bad_shapes=[("out", (3,)), ("out", (4, 5))],
       extra=[("axis=(0,0)", ValueError, {"axis": (0, 0)}),
              ("axis=(0,3)", ValueError, {"axis": (0, 3)}),
              ("axis=()", ValueError, {"axis": ()}),
              ("axis=(0,True)", TypeError, {"axis": (0, True)}),
              ("axis=[0,2]", TypeError, {"axis": [0, 2]})]),
    Op("mean_t", Arr("a", (3, 4, 5)), Fixed("axis", (0, 2)), Arr("out", (4,)),
       bad_shapes=[("out", (3,)), ("out", (4, 5)), ("a", (3, 5, 5))],
       bad_ranks=[("out", (4, 1, 1, 1))],
       extra=[("axis=(1,1)", ValueError, {"axis": (1, 1)}),
              ("out-view-of-a", ValueError, {"shapes": {"a": (4, 1), "out": (4,)},
                                             "axis": 1, "view": ("out", "a", (4,))})]),
    *[Op(name, Arr("a", (3, 4, 5)), Fixed("axis", 1), Arr("out", (3, 5)),
         bad_shapes=[("out", (3, 4)), ("out", (4, 5))], bad_ranks=[("out", (15,))],
         extra=[("axis=3", ValueError, {"axis": 3}), ("axis=None", TypeError, {"axis": None}),
                ("axis=(1,)", TypeError, {"axis": (1,)}), ("axis=1.0", TypeError, {"axis": 1.0}),
                ("empty-axis", ValueError, {"shapes": {"a": (3, 0, 5)}}),
                ("out-view-of-a", ValueError, {"shapes": {"a": (3, 1, 5)},
                                               "view": ("out", "a", (3, 5))})])
      for name in ("max_t", "min_t", "argmax_t")],
    Op("transpose_m", Arr("a", (3, 4)), Arr("out", (4, 3)),
       bad_shapes=[("out", (3, 4)), ("out", (4, 4))], bad_ranks=[("a", (12,)), ("out", (12,))],
       extra=[("out-overlaps-a", ValueError, {"overlap": ("a", "out", (5, 4))})]),
    Op("permute_t", Arr("a", (2, 3, 4)), Fixed("axes", (1, 2, 0)), Arr("out", (3, 4, 2)),
       bad_shapes=[("out", (2, 3, 4)), ("out", (3, 4, 3))],
       bad_ranks=[("out", (3, 8)), ("a", (2, 3, 4, 1))],
       extra=[("axes=(0,1)", ValueError, {"axes": (0, 1)}),
              ("axes=(0,0,1)", ValueError, {"axes": (0, 0, 1)}),
              ("axes=(1,2,3)", ValueError, {"axes": (1, 2, 3)}),
              ("axes=None", TypeError, {"axes": None}),
              ("axes=(1.0,2,0)", TypeError, {"axes": (1.0, 2, 0)}),
              ("rank-5", ValueError, {"shapes": {"a": (1, 2, 1, 3, 1), "out": (1, 2, 1, 3, 1)},
                                      "axes": (0, 1, 2, 3, 4)}),
              ("out-overlaps-a", ValueError, {"overlap": ("a", "out", (25,))})]),
    Op("concat_t", Arr("a", (3, 4)), Arr("b", (3, 2)), Fixed("axis", 1), Arr("out", (3, 6)),
       bad_shapes=[("out", (3, 7)), ("b", (2, 2)), ("a", (4, 4))],
       bad_ranks=[("out", (18,)), ("a", (3, 4, 1))],
       extra=[("axis=2", ValueError, {"axis": 2}), ("axis=0", ValueError, {"axis": 0}),
              ("axis=1.0", TypeError, {"axis": 1.0}),
              ("out-is-a", ValueError, {"shapes": {"a": (3, 6), "b": (3, 0)},
                                        "alias": {"out": "a"}}),
              ("out-overlaps-b", ValueError, {"overlap": ("b", "out", (4, 5))})]),
    Op("split_t", Arr("a", (3, 6)), Fixed("axis", -1), Arr("out_a", (3, 4)),
       Arr("out_b", (3, 2)),
       bad_shapes=[("out_a", (3, 5)), ("out_b", (2, 2)), ("a", (3, 7))],
       bad_ranks=[("a", (18,)), ("out_b", (6,))],
       extra=[("axis=-3", ValueError, {"axis": -3}),
              ("out_a-overlaps-a", ValueError, {"overlap": ("a", "out_a", (4, 6))}),
              ("out_b-is-out_a", ValueError, {"shapes": {"a": (3, 4), "out_a": (3, 2)},
                                              "alias": {"out_b": "out_a"}})]),
    # elementwise: every row of the op table
    *[elementwise(op) for op in ELEMENTWISE.values()],
    Op("broadcast_t", Arr("a", (3, 1, 5)), Fixed("axis", 1), Arr("out", (3, 4, 5)),
       bad_shapes=[("a", (3, 2, 5)), ("a", (3, 1, 6)), ("out", (3, 4, 6))],
       bad_ranks=[("a", (3, 5)), ("out", (3, 4, 5, 1))],
       extra=[("axis=3", ValueError, {"axis": 3}), ("axis=-4", ValueError, {"axis": -4}),
              ("axis=0", ValueError, {"axis": 0}), ("axis=1.5", TypeError, {"axis": 1.5}),
              ("out-rank-0", ValueError, {"axis": 0, "shapes": {"a": (), "out": ()}}),
              ("out-overlaps-a", ValueError, {"overlap": ("a", "out", (3, 4, 5))})]),
    *[mv(n) for n in ("add_mv", "subtract_mv", "mult_mv", "divide_mv")],
    Op("softmax_m", Arr("m", SH), Arr("out", SH), same_shape=True,
       extra=[("both-1d", ValueError, {"shapes": {"m": FLAT, "out": FLAT}}),
              ("both-3d", ValueError, {"shapes": {"m": (2, 3, 4), "out": (2, 3, 4)}}),
              ("no-columns", ValueError, {"shapes": {"m": (3, 0), "out": (3, 0)},
                                          "match": ["columns", r"\(3, 0\)"]})]),
    # indexing and masks
    Op("index_m_by_v", Arr("m", (4, 5)), Arr("v", (4, 1), index_values(5)), Arr("out", (4, 1)),
       bad_shapes=[("m", (5, 5)), ("v", (5, 1)), ("v", (4, 2)), ("out", (5, 1)), ("out", (4, 2))],
       bad_ranks=[("m", (20,)), ("v", (4,)), ("out", (4,))],
       extra=[("out-overlaps-m", ValueError, {"overlap": ("m", "out", (4, 5))}),
              ("out-overlaps-v", ValueError, {"overlap": ("v", "out", (5, 1))})]),
    Op("binarize_v", Arr("v", (4, 1), index_values(5)), Arr("out", (4, 5)),
       bad_shapes=[("v", (5, 1)), ("v", (4, 2)), ("out", (5, 5))],
       bad_ranks=[("v", (4,)), ("out", (20,))],
       extra=[("out-is-v", ValueError, {"shapes": {"out": (4, 1)}, "alias": {"out": "v"}})]),
    Op("gather_rows_m", Arr("table", (5, 3)), Arr("idx", (4,), index_values(5)),
       Arr("out", (4, 3)),
       bad_shapes=[("table", (5, 4)), ("idx", (5,)), ("idx", (4, 2)), ("out", (4, 4)),
                   ("out", (5, 3))],
       bad_ranks=[("table", (15,)), ("out", (12,)), ("idx", (4, 1, 1))],
       extra=[("out-overlaps-table", ValueError, {"overlap": ("table", "out", (6, 3))}),
              ("out-overlaps-idx", ValueError, {"shapes": {"idx": (4, 1)},
                                                "overlap": ("idx", "out", (5, 3))})]),
    Op("scatter_add_rows_m", Arr("a", (4, 3)), Arr("idx", (4, 1), index_values(5)),
       Arr("out", (5, 3)),
       bad_shapes=[("a", (4, 4)), ("a", (5, 3)), ("idx", (3, 1)), ("out", (5, 2))],
       bad_ranks=[("a", (12,)), ("out", (15,)), ("idx", (4, 1, 1))],
       extra=[("out-overlaps-a", ValueError, {"overlap": ("a", "out", (6, 3))}),
              ("out-overlaps-idx", ValueError, {"shapes": {"idx": (4, 1)},
                                                "overlap": ("idx", "out", (6, 3))})]),
    Op("normalize_rows_m", Arr("x", SH), Scalar("eps", 1e-3), Arr("xhat", SH),
       Arr("rstd", (3, 1)),
       bad_shapes=[("xhat", OTHER), ("rstd", (4, 1)), ("rstd", (3, 2))],
       bad_ranks=[("x", FLAT), ("rstd", (3,))],
       extra=[("eps<0", ValueError, {"eps": -1e-3}),
              ("eps=nan", ValueError, {"eps": NAN}),
              ("eps=inf", ValueError, {"eps": INF, "match": ["eps", "inf"]}),
              ("empty-rows", ValueError, {"shapes": {"x": (3, 0), "xhat": (3, 0)}}),
              ("xhat-overlaps-x", ValueError, {"overlap": ("x", "xhat", (4, 4))}),
              ("rstd-overlaps-x", ValueError, {"overlap": ("x", "rstd", (3, 4))}),
              ("rstd-overlaps-xhat", ValueError, {"overlap": ("xhat", "rstd", (3, 4))})]),
    Op("normalize_rows_backward_m", Arr("xhat", SH), Arr("rstd", (3, 1)), Arr("g", SH),
       Arr("dx", SH),
       bad_shapes=[("g", OTHER), ("dx", OTHER), ("rstd", (4, 1))],
       bad_ranks=[("xhat", FLAT), ("rstd", (3,))],
       extra=[("dx-is-g", ValueError, {"alias": {"dx": "g"}}),
              ("dx-is-xhat", ValueError, {"alias": {"dx": "xhat"}}),
              ("dx-overlaps-rstd", ValueError, {"overlap": ("rstd", "dx", (3, 4))})]),
    Op("is_fully_finite", Arr("a", SH)),
    # randomness
    Op("fill_gaussian", Scalar("mean", 0.0), Scalar("std", 1.0), Arr("out", SH),
       extra=[("std<0", ValueError, {"std": -1.0}),
              ("std=nan", ValueError, {"std": NAN, "match": ["std", "nan"]}),
              ("std=inf", ValueError, {"std": INF, "match": ["std", "inf"]}),
              ("mean=nan", ValueError, {"mean": NAN, "match": ["mean", "nan"]}),
              ("mean=inf", ValueError, {"mean": INF, "match": ["mean", "inf"]}),
              ("mean=-inf", ValueError, {"mean": -INF, "match": ["mean", "-inf"]})]),
    Op("generate_probability_mask", Arr("mask", SH), Scalar("p", 0.5),
       extra=[("p=1.5", ValueError, {"p": 1.5}), ("p=-0.1", ValueError, {"p": -0.1}),
              ("p=nan", ValueError, {"p": NAN, "match": ["p", "nan"]})]),
    # attention: q (B, H, T, D) = (2, 3, 4, 5), k and v (2, 3, 6, 5), lse (2, 3, 4)
    Op("attention_forward", Arr("q", Q4), Arr("k", K4), Arr("v", K4), Arr("out", Q4),
       Arr("lse", L3), Fixed("causal", False), Fixed("scale", None),
       bad_shapes=[("k", (2, 3, 6, 4)), ("v", (2, 3, 7, 5)), ("out", (2, 3, 4, 6)),
                   ("lse", (2, 3, 5)), ("q", (2, 2, 4, 5))],
       bad_ranks=[("q", (6, 4, 5)), ("lse", (2, 3, 4, 1)), ("k", (6, 6, 5))],
       extra=[("scale=0", ValueError, {"scale": 0}), ("scale=-1", ValueError, {"scale": -1.0}),
              ("scale=nan", ValueError, {"scale": NAN, "match": ["scale", "nan"]}),
              ("scale=inf", ValueError, {"scale": float("inf")}),
              ("scale='a'", ValueError, {"scale": "a"}),
              ("empty-queries", ValueError, {"shapes": {"q": (2, 3, 0, 5), "out": (2, 3, 0, 5),
                                                        "lse": (2, 3, 0)}}),
              ("empty-keys", ValueError, {"shapes": {"k": (2, 3, 0, 5), "v": (2, 3, 0, 5)}}),
              *[(f"out-overlaps-{i}", ValueError, {"overlap": (i, "out", (n,))})
                for i, n in (("q", 121), ("k", 181), ("v", 181))]]),
    Op("attention_backward", Arr("q", Q4), Arr("k", K4), Arr("v", K4), Arr("out", Q4),
       Arr("lse", L3), Arr("dout", Q4), Arr("dq", Q4), Arr("dk", K4), Arr("dv", K4),
       Fixed("causal", True), Fixed("scale", None),
       bad_shapes=[("dout", (2, 3, 4, 6)), ("dq", (2, 3, 6, 5)), ("dk", Q4), ("dv", (2, 3, 6, 4)),
                   ("lse", (2, 3, 6))],
       bad_ranks=[("dout", (6, 4, 5)), ("dk", (6, 6, 5))],
       extra=[("scale=0", ValueError, {"scale": 0}),
              *[(f"{o}-overlaps-{i}", ValueError, {"overlap": (i, o, (n,))})
                for i, o, n in (("q", "dq", 121), ("k", "dk", 181), ("v", "dv", 181),
                                ("out", "dq", 121), ("lse", "dq", 121), ("dout", "dq", 121))]]),
    # convolution and pooling (NCHW): x (2, 3, 5, 6), w (4, 3, 3, 2), y (2, 4, 3, 5)
    *[conv(name, arrays) for name, arrays in [
        ("conv2d_forward", (("x", X4), ("w", W4), ("out", Y4))),
        ("conv2d_backward_data", (("dy", Y4), ("w", W4), ("dx", X4))),
        ("conv2d_backward_filter", (("x", X4), ("dy", Y4), ("dw", W4)))]],
    Op("conv2d_bias_act", Arr("x", X4), Arr("w", W4), Arr("bias", (4,)), Arr("out", Y4),
       Fixed("stride", 1), Fixed("padding", 0), Fixed("dilation", 1), Fixed("act", "relu"),
       bad_shapes=[("x", (2, 3, 5, 7)), ("w", (4, 2, 3, 2)), ("bias", (3,)), ("bias", (5,)),
                   ("out", (2, 4, 3, 4))],
       bad_ranks=[("x", (2, 3, 30)), ("bias", (1, 4)), ("out", (2, 4, 15))],
       extra=[("act=tanh", ValueError, {"act": "tanh", "match": ["act", "tanh"]}),
              ("act=1", ValueError, {"act": 1}),
              ("stride=0", ValueError, {"stride": 0}),
              ("no-output", ValueError, {"dilation": 3}),
              *[(f"out-overlaps-{i}", ValueError, {"overlap": (i, "out", (121,))})
                for i in ("x", "w", "bias")]]),
    pool("maxpool2d_forward", (("x", X4), ("out", P4), ("argmax", P4)),
         [("out-is-argmax", ValueError, {"alias": {"argmax": "out"}})]),
    pool("maxpool2d_backward", (("argmax", P4, argmax_values), ("dy", P4), ("dx", X4)),
         [("dx-overlaps-dy", ValueError, {"overlap": ("dy", "dx", (200,))}),
          ("dx-overlaps-argmax", ValueError, {"overlap": ("argmax", "dx", (200,))})]),
    pool("avgpool2d_forward", (("x", X4), ("out", P4)), []),
    pool("avgpool2d_backward", (("dy", P4), ("dx", X4)), []),
    # streams (the rest of the stream API is tested in test_streams_api.py)
    Op("wait_for", Fixed("other", "self"),
       extra=[("other=object", ValueError, {"other": object()}),
              ("other=another-handler", ValueError, {"other": "fresh-handler"})]),
]
OPS_BY_NAME = {op.name: op for op in OPS}


def method(op_name):
    """The handler method a description is for ("sum_t-axes": sum_t)."""
    return op_name.split("-")[0]


def _cases():
    for op in OPS:
        for p in op.params:
            if isinstance(p, Arr):
                yield op.name, f"{p.name}-list", TypeError, {"bad": (p.name, "list")}
                yield op.name, f"{p.name}-foreign", TypeError, {"bad": (p.name, "foreign")}
                if not p.any_format:   # test_twin.py: formats the class does not hold
                    yield op.name, f"{p.name}-dtype", TypeError, {"bad": (p.name, "dtype")}
                yield op.name, f"{p.name}-noncontig", ValueError, {"bad": (p.name, "noncontig")}
            elif isinstance(p, Host):
                yield op.name, f"{p.name}-object", TypeError, {p.name: object()}
                yield op.name, f"{p.name}-complex", TypeError, {"bad": (p.name, "complex")}
                yield op.name, f"{p.name}-str-array", TypeError, {"bad": (p.name, "str")}
            elif isinstance(p, Scalar):
                yield op.name, f"{p.name}-str", TypeError, {p.name: "0.5"}
                yield op.name, f"{p.name}-complex", TypeError, {p.name: 1 + 2j}
                yield op.name, f"{p.name}-None", TypeError, {p.name: None}
        for name, shape in op.bad_shapes:
            yield op.name, f"{name}-shape{shape}", ValueError, {"shapes": {name: shape},
                                                               "names_shape": name}
        for name, shape in op.bad_ranks:
            yield op.name, f"{name}-rank{shape}", ValueError, {"shapes": {name: shape},
                                                              "names_shape": name}
        for case_id, exc, change in op.extra:
            yield op.name, case_id, exc, change


CASES = []
for _op, _id, _exc, _change in _cases():
    _marks = [pytest.mark.xfail(strict=True, reason=_change["xfail"])] if "xfail" in _change else []
    CASES.append(pytest.param(_op, _exc, _change, id=f"{_op}:{_id}", marks=_marks))


# ---------------------------------------------------------------- building a call
class Call:
    """The arguments of one call of ``op`` on ``handler``, with one thing broken.

    Every handler array the call can see is recorded (views by their base), so
    that the test can check afterwards that none of them changed.
    """

    def __init__(self, handler, handler_id, sibling_handler, make_handler, rng, op, change):
        self.h, self.rng = handler, rng
        self.h_id = handler_id
        self.sibling_handler, self.make_handler = sibling_handler, make_handler
        self.watched = []  # (handler that owns it, array, contents before)
        self.shape_named = None
        shapes = change.get("shapes", {})
        self.args = {}
        for p in op.params:
            if isinstance(p, Arr):
                shape = shapes.get(p.name, p.shape)
                self.args[p.name] = self.array(shape, p.values)
            elif isinstance(p, Host):
                self.args[p.name] = rand(shapes.get(p.name, p.shape), rng)
            else:
                self.args[p.name] = p.value
        if "names_shape" in change:
            self.shape_named = shapes[change["names_shape"]]
        for name, other in change.get("alias", {}).items():
            self.args[name] = self.args[other]
        if "overlap" in change:  # two overlapping slices of one base array
            a_name, out_name, base_shape = change["overlap"]
            self.overlap(a_name, out_name, base_shape)
        if "view" in change:     # out is a reshaped view of a
            name, of, shape = change["view"]
            self.args[name] = self.try_view(lambda: self.args[of].reshape(shape))
        if "bad" in change:
            name, kind = change["bad"]
            self.args[name] = self.broken(kind, name, self.args[name])
        for key, value in change.items():
            if key not in ("shapes", "alias", "overlap", "view", "bad", "names_shape", "xfail",
                           "match"):
                self.args[key] = value
        if self.args.get("other") == "self":
            self.args["other"] = handler.with_streams(1 % handler.num_stream_groups)
        elif self.args.get("other") == "fresh-handler":
            self.args["other"] = make_handler(handler_id, seed=0)

    def array(self, shape, values=None, h=None):
        h = h or self.h
        data = values(shape, self.rng) if values else rand(shape, self.rng)
        a = h.create_from_numpy(data)
        self.watched.append((h, a, h.get_numpy_copy(a)))
        return a

    def try_view(self, make):
        try:
            return make()
        except Exception as e:  # a handler array type without such views
            pytest.skip(f"{type(self.h).__name__} arrays cannot make this view: {e}")

    def overlap(self, a_name, out_name, base_shape):
        base = self.array(base_shape)
        a_shape = tuple(self.args[a_name].shape)
        out_shape = tuple(self.args[out_name].shape)
        flat = self.try_view(lambda: base.reshape(-1))
        n_a, n_out = int(np.prod(a_shape)), int(np.prod(out_shape))
        self.args[a_name] = self.try_view(lambda: flat[:n_a].reshape(a_shape))
        self.args[out_name] = self.try_view(lambda: flat[flat.size - n_out:].reshape(out_shape))

    def broken(self, kind, name, good):
        h, shape = self.h, tuple(getattr(good, "shape", ()))
        if kind == "list":
            return h.get_numpy_copy(good).tolist()
        if kind == "foreign":
            if h.array_type is np.ndarray:
                return NotAnArray(shape, h.dtype)
            return h.get_numpy_copy(good)  # a NumPy array given to a device handler
        if kind == "dtype":
            sibling = self.sibling_handler(self.h_id, other_dtype(h.dtype))
            self.bad_dtype = other_dtype(h.dtype)
            return self.array(shape, h=sibling)
        if kind == "noncontig":
            if not shape:
                pytest.skip("a 0-d array is always contiguous")
            wide = self.array(shape[:-1] + (2 * shape[-1],))
            view = self.try_view(lambda: wide[..., ::2])
            if getattr(getattr(view, "flags", None), "c_contiguous", True):
                pytest.skip(f"{type(h).__name__} cannot make a non-contiguous view")
            return view
        if kind == "complex":
            return good + 1j
        if kind == "str":
            return good.astype(str)
        raise AssertionError(kind)

    def check_unchanged(self):
        for h, a, before in self.watched:
            np.testing.assert_array_equal(h.get_numpy_copy(a), before,
                                          err_msg="an array changed although the op raised")


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("op_name,exc,change", CASES)
def test_bad_input(handler, handler_id, sibling_handler, make_handler, rng, op_name, exc, change):
    op = OPS_BY_NAME[op_name]
    call = Call(handler, handler_id, sibling_handler, make_handler, rng, op, change)
    with pytest.raises(exc) as info:
        getattr(handler, method(op_name))(*call.args.values())
    assert info.type is exc, f"raised {info.type.__name__}, expected exactly {exc.__name__}"
    msg = str(info.value)
    assert re.search(rf"\b{method(op_name)}\b", msg), f"message does not name {op_name}: {msg!r}"
    if call.shape_named is not None:
        assert str(call.shape_named) in msg, f"message does not show {call.shape_named}: {msg!r}"
    if "bad" in change and change["bad"][1] == "dtype":
        assert str(call.bad_dtype) in msg, f"message does not show the dtype: {msg!r}"
    if "bad" in change and change["bad"][1] == "list":
        assert "list" in msg, f"message does not name the type: {msg!r}"
    match = change.get("match", ())
    for pattern in [match] if isinstance(match, str) else match:
        assert re.search(pattern, msg), f"message does not say {pattern!r}: {msg!r}"
    call.check_unchanged()


@pytest.mark.parametrize("op_name", list(OPS_BY_NAME))
def test_valid_call(handler, handler_id, sibling_handler, make_handler, rng, op_name):
    """The undamaged call of each description works: a bad case fails for its
    own reason, not because the description is wrong."""
    call = Call(handler, handler_id, sibling_handler, make_handler, rng, OPS_BY_NAME[op_name], {})
    # The reference: the same call on NumPy in float64, on copies of the inputs.
    ref = NumpyHandler(np.float64)
    copies = {id(a): before.astype(np.float64) for _, a, before in call.watched}
    ref_args = [copies.get(id(v), v) if not isinstance(v, Handler) else ref
                for v in call.args.values()]
    got = getattr(handler, method(op_name))(*call.args.values())
    want = getattr(ref, method(op_name))(*ref_args)
    if op_name in RANDOM_OR_UNDEFINED:
        return
    if isinstance(want, np.ndarray):
        got = handler.get_numpy_copy(got) if not isinstance(got, np.ndarray) else got
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{op_name} result")
    elif want is None or isinstance(want, bool):
        assert got == want, f"{op_name} returned {got!r}, NumPy float64 {want!r}"
    for _, a, _ in call.watched:
        np.testing.assert_allclose(handler.get_numpy_copy(a), copies[id(a)], rtol=1e-5,
                                   atol=1e-6, equal_nan=True, err_msg=f"{op_name} array")


# Ops whose results cannot be compared with a second handler's.
RANDOM_OR_UNDEFINED = {"fill_gaussian", "generate_probability_mask", "allocate"}


def test_every_op_has_bad_input_cases():
    ops = {name for name, value in vars(Handler).items()
           if callable(value) and not name.startswith("_")}
    streams = {"with_streams", "record_event", "wait_event", "synchronize",
               "synchronize_all_streams",   # tested in test_streams_api.py
               "capture", "close",          # tested in test_graphs.py
               "twin",                      # tested in test_twin.py
               "random_state", "set_random_state"}   # tested in test_checkpoint.py
    # tested in test_prefetch.py::test_bad_input and test_interop.py
    pipeline = {"prefetch", "pin", "get_numpy_copy_async", "empty_pinned",
                "create_from_device_array"}
    assert not ops - streams - pipeline - set(OPS_BY_NAME), "ops without bad-input cases"
    per_op = {name: sum(1 for p in CASES if p.values[0] == name) for name in OPS_BY_NAME}
    assert min(per_op.values()) >= 2, per_op


def test_every_forbidden_overlap_has_a_case():
    # The op table says which inputs an output must not overlap (disjoint) or
    # may overlap only as the very same memory (exact); the public methods
    # check both.  Each such pair needs a case above that hands the op an
    # output over that input's memory.
    def aliased(change):
        if "alias" in change:
            return set(change["alias"].values())
        if "overlap" in change:
            return {change["overlap"][0]}
        if "view" in change:
            return {change["view"][1]}
        return set()
    for name, row in PUBLIC.items():
        covered = set().union(*(aliased(c) for _, _, c in OPS_BY_NAME[name].extra)) \
            if name in OPS_BY_NAME else set()
        missing = set(row.disjoint + row.exact) - covered
        assert not missing, f"{name}: no case puts the output over {sorted(missing)}"


# ---------------------------------------------------------------- index_m_by_v without columns
@pytest.mark.parametrize("out_is_v", [False, True], ids=["out", "out-is-v"])
def test_index_m_by_v_without_columns_gives_nan(handler, rng, out_is_v):
    """m (r, 0): no index is in [0, 0), so every row's result is NaN (the
    op's doc), whatever v holds; m, which has no memory, is never read."""
    idx = np.array([[0.0], [1.0], [-1.0], [np.nan], [2.5]])
    m = handler.create_from_numpy(np.zeros((5, 0)))
    v = handler.create_from_numpy(idx)
    out = v if out_is_v else handler.create_from_numpy(rand((5, 1), rng))
    assert handler.index_m_by_v(m, v, out) is None
    got = handler.get_numpy_copy(out)
    assert got.shape == (5, 1) and np.isnan(got).all(), got
    if not out_is_v:
        np.testing.assert_array_equal(handler.get_numpy_copy(v), idx.astype(handler.dtype))
    empty = handler.zeros((0, 0))           # no rows either: nothing to do
    handler.index_m_by_v(empty, handler.zeros((0, 1)), handler.zeros((0, 1)))


# ---------------------------------------------------------------- a closed handler
def _assert_closed_error(info, op):
    assert info.type is CaptureError, f"{op}: raised {info.type.__name__}: {info.value}"
    assert str(info.value) == f"{op}: the handler is closed", str(info.value)
    assert info.value.op == op


def test_every_op_raises_after_close(handler, handler_id, sibling_handler, make_handler, rng):
    """After close(), each op of the handler and of its stream-group views
    (made before or after the close) raises CaptureError "<op>: the handler
    is closed", and writes nothing."""
    h = make_handler(handler_id, seed=0)
    early = h.with_streams(1)                # a view made before the close
    calls = [(name, Call(h, handler_id, sibling_handler, make_handler, rng, op, {}))
             for name, op in OPS_BY_NAME.items()]
    h.close()
    h.close()                                # safe twice
    late = h.with_streams(h.num_stream_groups - 1)
    failures = []
    for target in (h, early, late):
        for name, call in calls:
            op = method(name)
            try:
                getattr(target, op)(*call.args.values())
            except Exception as e:
                if type(e) is not CaptureError or str(e) != f"{op}: the handler is closed" \
                        or e.op != op:
                    failures.append(f"group {target.group} {name}: {type(e).__name__}: {e}")
            else:
                failures.append(f"group {target.group} {name}: no error")
    assert not failures, "\n".join(failures)
    for _, call in calls:   # read through the session's open handler
        for _, a, before in call.watched:
            np.testing.assert_array_equal(handler.get_numpy_copy(a), before,
                                          err_msg="an array changed after close()")


SQUARE = fused_op("closed_square", inputs="x", outputs="y", body="y = x * x")


def test_other_calls_raise_after_close(handler, handler_id, make_handler, rng):
    """The calls outside the op table too: events, synchronization, transfers,
    twins, fused ops (called or bound before the close), captures."""
    h = make_handler(handler_id, seed=0)
    other = other_dtype(h.dtype)
    twin = h.twin(other)
    t_a = twin.create_from_numpy(rand((3, 4), rng))
    a0, y0 = rand((3, 4), rng), rand((3, 4), rng)
    a, y = h.create_from_numpy(a0), h.create_from_numpy(y0)
    event = h.record_event()
    bound = SQUARE.bind(h, a, y)
    g = h.capture(lambda: h.relu(a, y))
    h.close()
    v = h.with_streams(1)
    calls = {
        "record_event": lambda: v.record_event(),
        "wait_event": lambda: v.wait_event(event),
        "wait_for": lambda: v.wait_for(h),
        "synchronize": lambda: v.synchronize(),
        "synchronize_all_streams": lambda: h.synchronize_all_streams(),
        "prefetch": lambda: h.prefetch([np.zeros((2, 3))]),
        "pin": lambda: h.pin(np.zeros(3)),
        "empty_pinned": lambda: h.empty_pinned((3,)),
        "get_numpy_copy_async": lambda: v.get_numpy_copy_async(a),
        "create_from_device_array": lambda: h.create_from_device_array(a),
        "twin": lambda: h.twin("float16" if h.dtype != np.float16 else "float32"),
        "add_tt": lambda: twin.add_tt(t_a, t_a, t_a),   # a twin closes with its family
        "closed_square": lambda: SQUARE(v, a, y),
        "capture": lambda: h.capture(lambda: None),
        "replay": lambda: g.replay(),
    }
    for op, call in calls.items():
        with pytest.raises(CaptureError) as info:
            call()
        _assert_closed_error(info, op)
    with pytest.raises(CaptureError) as info:
        bound()
    _assert_closed_error(info, "closed_square")
    assert h.with_streams(0) is h and h.twin(other) is twin
    np.testing.assert_array_equal(handler.get_numpy_copy(a), a0.astype(h.dtype))
    np.testing.assert_array_equal(handler.get_numpy_copy(y), y0.astype(h.dtype))


# ---------------------------------------------------------------- the handler's seed
@pytest.mark.parametrize("seed, exc", [
    ("abc", TypeError), (1.5, TypeError), (True, TypeError), ([1], TypeError),
    (np.float64(2.0), TypeError), (-1, ValueError), (np.int64(-2), ValueError)],
    ids=["str", "float", "bool", "list", "np.float64", "-1", "np.int64(-2)"])
def test_bad_seed_is_refused(handler_id, make_handler, seed, exc):
    with pytest.raises(exc) as info:
        make_handler(handler_id, seed=seed)
    assert info.type is exc
    msg = str(info.value)
    cls = "NumpyHandler" if handler_id.startswith("numpy") else "PyCudaHandler"
    assert msg.startswith(f"{cls}: seed must be None or an int >= 0"), msg
    assert msg.endswith(f"got {seed!r}"), msg


@pytest.mark.parametrize("seed", [None, 0, 5, np.int64(5), np.uint8(5), 2**70],
                         ids=["None", "0", "5", "np.int64", "np.uint8", "2**70"])
def test_good_seed_is_accepted(handler_id, make_handler, seed):
    h = make_handler(handler_id, seed=seed)
    out = h.zeros((4,))
    h.fill_gaussian(0.0, 1.0, out)
    if seed is not None and seed == 5:   # a NumPy int seeds as the int it holds
        ref = make_handler(handler_id, seed=5)
        want = ref.zeros((4,))
        ref.fill_gaussian(0.0, 1.0, want)
        np.testing.assert_array_equal(h.get_numpy_copy(out), ref.get_numpy_copy(want))


# ---------------------------------------------------------------- fused_op nesting
def _limit():
    return getattr(fused, "MAX_DEPTH", 100)


def _chain(op, n):
    """y = x <op> x <op> ... : n operations nested (left to right)."""
    return "y = " + f" {op} ".join(["x"] * (n + 1))


@pytest.mark.parametrize("body", [
    _chain("+", 3000), _chain("*", 1500), _chain("and", 3000), _chain("<", 3000),
    "y = " + "-" * 3000 + "x", "y = " + "not " * 3000 + "x", "y = " + "-" * 100000 + "x",
    "y = " + " if x else ".join(["x"] * 3000), "y = x ** " + "-" * 5000 + "2",
    "y = " + "+".join(["x"] * 300000), _chain("+", 101), "y = " + "-" * 101 + "x",
    "t = " + "exp(" * 60 + "x" + ")" * 60 + "\ny = " + "tanh(" * 60 + "t" + ")" * 60 + " + x"
    + " and x" * 50],
    ids=["sum-3000", "product-1500", "and-3000", "compare-3000", "neg-3000", "not-3000",
         "neg-100000", "if-3000", "pow-neg-5000", "sum-300000", "sum-101", "neg-101",
         "calls-and-chain"])
def test_fused_op_nesting_beyond_the_limit(body):
    """A body nested deeper than the limit is refused with a ValueError that
    names fused_op and the limit, never a RecursionError or MemoryError."""
    with pytest.raises(ValueError) as info:
        fused_op("deep", inputs="x", outputs="y", body=body)
    msg = str(info.value)
    assert msg.startswith("deep: "), msg
    assert "fused_op" in msg and f"limit of {_limit()} " in msg, msg


def test_fused_op_at_the_nesting_limit_runs(handler, rng):
    n = _limit()
    x0 = rand((3, 4), rng, 0.5, 1.0)
    x = handler.create_from_numpy(x0)
    held = x0.astype(handler.dtype).astype(np.float64)
    for body, want in ((_chain("+", n), (n + 1) * held),
                       ("y = " + "-" * n + "x", held if n % 2 == 0 else -held)):
        op = fused_op("at_limit", inputs="x", outputs="y", body=body)
        y = handler.zeros((3, 4))
        op(handler, x, y)
        np.testing.assert_allclose(handler.get_numpy_copy(y), want, rtol=1e-4)


def test_a_prefetch_begun_before_close_raises_at_its_next_batch(handler_id, make_handler, rng):
    """A prefetch iterator outliving its handler's close issues nothing more on
    the closed streams: its next batch raises, and its reader thread ends."""
    h = make_handler(handler_id, seed=0)
    before = threading.active_count()
    it = h.prefetch([rand((2, 3), rng) for _ in range(6)], depth=2)
    next(it)
    h.close()
    with pytest.raises(CaptureError, match="prefetch: the handler is closed"):
        next(it)
    deadline = time.monotonic() + 30
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before
