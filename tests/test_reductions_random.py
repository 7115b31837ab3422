"""Randomized tests of the reductions (``sum_t``, ``mean_t``, ``max_t``,
``min_t``, ``argmax_t``) on every handler configuration, half formats included.

The cases (shape, axis, output shape, data kind, element offsets of the input
and the output) are drawn at collection time from a fixed master seed, so
their ids are stable; the data of each test is fresh, from the ``rng`` fixture
(seeded from the session's base seed and the test's id: a failure report
gives the ``--seed`` that replays it).  Three groups:

* random cases: rank 1 to 4, extents from :data:`EXTENTS` and random primes,
  at most :data:`BUDGET` elements;
* layout cases: each layout the GPU's reduction engine tells apart after it
  canonicalizes a shape (size-1 axes dropped, adjacent axes merged): short
  rows (2 to 64 elements), medium rows, long rows split over blocks, 1-D to
  a scalar, strided columns under few or many rows (rows 16-byte aligned
  or not: an odd inner extent), "mid" reductions (NCHW over (0, 2, 3)) and
  the general kernel's interleavings (reduced and kept runs alternating,
  up to four of each, ending with either kind, chunked or not; five runs
  fall back to passes), at sizes a CPU runs in seconds;
* large cases (up to 16M elements): PyCudaHandler only (the suite has no
  slow marker: they skip on every other handler);
* special values for the extremes (:func:`test_extremes_special_values`):
  signed zeros, infinities, NaN among them and ties, per slice.

The reference is plain NumPy on float64 copies of the values as the handler
holds them (rounded to its format first), over the reduced axes moved last
and made contiguous, so that NumPy sums each result pairwise.  Sums and means
must be within a probabilistic bound of the accumulation error (see
:func:`sum_tolerance`); sums of small integers, exact in any order of float32
or float64 additions, must equal the exact sum rounded once to the format;
``max_t`` and ``min_t`` (a pick, not arithmetic) must match bit for bit, and
``argmax_t`` exactly (the first index among equals, or of the first NaN).

Inputs are views at element offset 0, 1 or 3 of a larger buffer, and outputs
views at offset 0 or 1 of a larger buffer poisoned with NaN: the elements of
that buffer outside the output must come back untouched.
"""
import math
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

from handlers import dtypes
from helpers import as_handler_values, assert_unchanged, rand, shape_id

#: every reduction runs on the float16 and bfloat16 handlers too (test kit)
HALF_FORMATS = True

SUMS = ("sum_t", "mean_t")
EXTREMES = ("max_t", "min_t", "argmax_t")
OPS = SUMS + EXTREMES

MASTER_SEED = 0x5EEDED   # the cases (not the data: that comes from ``rng``)
RANDOM_CASES = 30        # per op
BUDGET = 1 << 17         # elements of a random case
EXTENTS = (1, 2, 3, 5, 7, 31, 32, 33, 127, 1000, 4097)
PRIMES = tuple(p for p in range(11, 5000)
               if all(p % d for d in range(2, math.isqrt(p) + 1)) and p not in EXTENTS)

#: Sums and means: lambda in the probabilistic bound of an accumulation in
#: unit roundoff u, lambda * u * sqrt(n) * sum|x| (Higham and Mary, 2019).
#: A recursive float32 sum of positive terms has an error of standard
#: deviation about u * sqrt(n) * sum|x| / 3, so 2 leaves six of them.
LAMBDA = 2.0


# =========================================================================== cases
@dataclass(frozen=True)
class Case:
    op: str
    shape: tuple
    axis: object          # int, tuple of ints or None, as passed to the op
    out_shape: tuple
    kind: str             # the data: see draw()
    in_off: int = 0       # element offset of the input view in its buffer
    out_off: int = 0      # element offset of the output view in its buffer
    tag: str = ""         # what the case is for (its layout), or "r<number>"

    @property
    def id(self):
        if self.axis is None:
            ax = f"axNone-out{shape_id(self.out_shape)}"
        else:
            kept = len(self.out_shape) == len(self.shape)
            ax = f"{axis_id(self.axis)}-{'keep' if kept else 'drop'}"
        return (f"{self.op}-{self.tag}-{shape_id(self.shape)}-{ax}-{self.kind}"
                f"-in{self.in_off}-out{self.out_off}")


def axis_id(axis):
    """``axis`` in a test id: ax1, ax-1, axNone; a tuple: axes0_2_3, axes1."""
    return f"axes{'_'.join(map(str, axis))}" if isinstance(axis, tuple) else f"ax{axis}"


def reduced_axes(shape, axis):
    """The op's ``axis`` as a sorted tuple of axes in range(len(shape))."""
    if axis is None:
        return tuple(range(len(shape)))
    axes = axis if isinstance(axis, tuple) else (axis,)
    return tuple(sorted(x % len(shape) for x in axes))


def out_shape_of(shape, axis, keep):
    axes = reduced_axes(shape, axis)
    if keep:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _case(op, shape, axis, kind, r, tag, keep=None, out_shape=None):
    """A case with the output shape and offsets drawn from ``r`` where not given."""
    if out_shape is None:
        if axis is None:
            out_shape = [(), (1,), (1,) * len(shape)][int(r.integers(3))]
        else:
            keep = bool(r.integers(2)) if keep is None else keep
            out_shape = out_shape_of(shape, axis, keep)
    return Case(op, tuple(shape), axis, tuple(out_shape), kind,
                in_off=int(r.choice([0, 0, 1, 3])), out_off=int(r.choice([0, 1])), tag=tag)


def _random_shape(r):
    nd = int(r.integers(1, 5))
    shape, left = [], BUDGET
    for i in range(nd):
        pool = [e for e in EXTENTS + (int(r.choice(PRIMES)),) if e <= left]
        e = int(r.choice(pool))
        shape.append(e)
        left //= e
    return tuple(int(x) for x in r.permutation(shape))


def _random_axis(op, nd, r):
    if op in EXTREMES:
        axis = int(r.integers(nd))
        return axis - nd if r.random() < 0.4 else axis
    pick = r.random()
    if pick < 0.15:
        return None
    if pick < 0.55:
        axis = int(r.integers(nd))
        return axis - nd if r.random() < 0.4 else axis
    k = int(r.integers(1, nd + 1))
    axes = [int(x) for x in r.permutation(nd)[:k]]
    return tuple(x - nd if r.random() < 0.3 else x for x in axes)


SUM_KINDS = ("pm1", "pos", "wide", "ints")
EXTREME_KINDS = ("pm1", "ints", "nan", "ints-nan")


def random_cases():
    r = np.random.default_rng(MASTER_SEED)
    cases = []
    for op in OPS:
        kinds = SUM_KINDS if op in SUMS else EXTREME_KINDS
        for i in range(RANDOM_CASES):
            shape = _random_shape(r)
            axis = _random_axis(op, len(shape), r)
            cases.append(_case(op, shape, axis, kinds[i % len(kinds)], r, f"r{i:02d}"))
    return cases


#: (layout, shape, axis).  The layout names what the GPU engine should make of
#: it after canonicalization; a tuple axis is for sum_t and mean_t only.
LAYOUTS = [
    ("rows2", (4097, 2), 1), ("rows33", (1000, 33), -1), ("rows64", (127, 64), 1),
    ("rows5", (31, 7, 5), 2), ("rows3", (2053, 3), -1),
    ("rows-canon", (7, 1, 31, 1), 2),            # (7, 31) over 1
    ("rows-merged", (5, 6, 7), (1, 2)),          # (5, 42) over 1
    ("rows-merged1", (3, 1, 5, 1, 7), (2, 3, 4)),
    ("medium", (33, 1000), 1), ("medium", (7, 4097), -1), ("medium-merged", (5, 127, 33), (1, 2)),
    ("long", (3, 262147), 1), ("long", (2, 131072), -1),
    ("scalar1d", (1000003,), 0), ("scalar1d", (65537,), None),
    ("scalar-merged", (2, 3, 4097), None), ("scalar-canon", (1, 30011, 1), 1),
    ("cols-few", (3, 4097), 0), ("cols-few", (2, 31, 33), 0), ("cols-few", (5, 1000), -2),
    ("cols-many", (20011, 5), 0), ("cols-many", (4097, 33), 0), ("cols-many", (65537, 2), 0),
    ("cols-canon", (1000, 1, 127), 0),           # (1000, 127) over 0
    ("cols-mid", (31, 127, 33), 1), ("cols-mid", (7, 4097, 5), -2),
    ("cols-merged", (4, 5, 6, 7), (0, 1)),       # (20, 42) over 0
    ("mid", (8, 3, 31, 33), (0, 2, 3)), ("mid", (32, 16, 7, 7), (0, 2, 3)),
    ("mid", (2, 3, 4, 5), (0, 3)), ("mid", (300, 3, 7), (0, 2)),
    ("mid-canon", (5, 1, 3, 127), (0, 2, 3)), ("mid", (1000, 7, 2), (-1, 0)),
    ("three-runs", (2, 3, 2, 3, 4), (0, 2, 4)),
    ("cols-odd", (42, 3229), 0), ("cols-odd", (7, 1000, 33), 1),   # rows not 16-byte aligned
    ("cols-odd-canon", (3, 1, 97, 23, 29), 0),                      # (3, 97 * 23 * 29) over 0
    # small slabs of few columns, a warp a slab (*_slab): lanes of a column
    # joined in a tree of 16, 10, 6 or 1 row groups
    ("slab", (999, 129, 2), 1), ("slab", (500, 12, 8), 1), ("slab", (300, 33, 3), 1),
    ("slab", (77, 100, 3), 1), ("slab", (40, 60, 5), -2),
    ("slab", (301, 40, 30), 1), ("slab-canon", (50, 1, 31, 17), 2),   # (50, 31, 17) over 1
    # the general kernel (sum_gen*): reduced and kept runs interleaved
    ("gen-rkrk", (593, 4, 11, 11), (0, 2)),      # few outputs: chunked
    ("gen-rkrk-vec", (97, 4, 11, 16), (0, 2)),   # packets where the input is aligned
    ("gen-krkr", (5, 31, 7, 33), (1, 3)),        # rows first
    ("gen-krkr-short", (300, 3, 200, 2), (1, -1)),   # many outputs of 6 elements
    ("gen-krkrk", (3, 5, 7, 11, 13), (1, 3)),
    ("gen-rkrkr", (9, 5, 7, 11, 13), (0, 2, 4)),
    ("gen-4runs", (2, 3, 2, 3, 2, 3, 2, 3), (0, 2, 4, 6)),
    ("gen-4runs-k", (3, 2, 3, 2, 3, 2, 3, 2), (1, 3, 5, 7)),
    ("gen-chunked", (3000, 2, 50, 3), (0, 2)),   # 6 outputs of 150000
    ("gen-krkr-long", (2, 3000, 3, 50), (1, 3)),   # the same, rows first
    ("gen-canon", (5, 1, 7, 3, 1, 9), (0, 3, 4)),   # (5, 7, 3, 9) over (0, 2)
    ("passes-5runs", (2,) * 10, (0, 2, 4, 6, 8)),   # beyond the general kernel
]


def layout_cases(layouts, kinds, tag_prefix=""):
    r = np.random.default_rng(MASTER_SEED + 1)
    cases = []
    for layout, shape, axis in layouts:
        for op in OPS:
            if op in EXTREMES and (axis is None or isinstance(axis, tuple)):
                continue
            for kind in kinds[op]:
                cases.append(_case(op, shape, axis, kind, r, tag_prefix + layout))
    return cases


LAYOUT_KINDS = {"sum_t": ("ints", "pm1"), "mean_t": ("ints", "pos"),
                "max_t": ("ints", "nan"), "min_t": ("pm1", "ints-nan"),
                "argmax_t": ("ints", "nan")}

#: The large cases, GPU only (up to 16M elements).
LARGE = [
    ("big-scalar1d", (8859584,), 0), ("big-long", (5, 1154496), 1),
    ("big-rows2", (400, 7035, 2), 2), ("big-cols-few", (42, 32276), 0),
    ("big-cols", (12, 1113, 344), 0), ("big-mid", (6, 1, 3, 275300), (0, 2, 3)),
    ("big-rows3", (81, 1, 1696, 3), 3), ("big-cols-many", (1048576, 16), 0),
    ("big-cols-odd", (42, 322763), 0), ("big-cols-odd4", (3, 6197, 23, 29), 0),
    ("big-gen-rkrk", (1031, 64, 13, 16), (0, 2)), ("big-gen-krkr", (64, 1000, 16, 13), (1, 3)),
]
LARGE_KINDS = {"sum_t": ("ints",), "mean_t": ("pos",), "max_t": ("ints",),
               "min_t": ("nan",), "argmax_t": ("ints", "nan")}

RANDOM = random_cases()
LAYOUT = layout_cases(LAYOUTS, LAYOUT_KINDS)
LARGE_CASES = (layout_cases(LARGE, LARGE_KINDS)
               + [Case("sum_t", (8859584,), None, (), "pm1", 1, 0, "big-scalar1d")])


def params(cases):
    return pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in cases])


# =========================================================================== data
def int_bound(n):
    """The largest |k| for integer data whose every partial sum over n terms
    stays below 2^24: then any float32 (or float64) order of additions is exact."""
    return max(1, min(8, (2 ** 24 - 1) // max(n, 1)))


def draw(kind, shape, k, n, r):
    """Host float64 data of ``kind``.  ``pm1``: uniform in [-1, 1) without
    zeros; ``pos``: uniform in [0.5, 1.5) (sums that grow: the accumulation
    error's worst case); ``wide``: ``pm1`` times 2^j, j in [-8, 8]; ``ints``:
    whole numbers in [-k, k]; ``nan`` and ``ints-nan``: ``pm1`` and ``ints``
    with NaN at random places, about one for every other result of a
    reduction over ``n`` elements (at least two in all)."""
    if kind.startswith("ints"):
        x = r.integers(-k, k + 1, shape).astype(np.float64)
    elif kind == "pos":
        x = r.uniform(0.5, 1.5, shape)
    elif kind == "wide":
        x = rand(shape, r) * np.exp2(r.integers(-8, 9, shape))
    else:
        x = rand(shape, r)
    if kind.endswith("nan") and x.size:
        at = r.integers(0, x.size, max(2, x.size // max(n, 1) // 2))
        x.reshape(-1)[at] = np.nan
    return x


def data_bound(op, kind, n, dtype):
    """``k`` of :func:`draw` for a reduction over ``n`` elements.  Sums of
    ``ints``: :func:`int_bound` (exact).  Extremes: about n / 8, so that the
    largest value of a slice recurs a few times at random places (the first
    one counts for ``argmax_t``), up to 2^20 and the whole numbers exact in
    ``dtype`` (2048 in float16, 256 in bfloat16)."""
    if kind.startswith("ints"):
        if op in SUMS:
            return int_bound(n)
        return max(1, min(n // 8, 2 ** 20, dtypes.exact_integers(dtype)))
    return 0


def as_rows(ra, axes):
    """``ra`` with the axes kept first and the reduced ones last, as a
    contiguous (kept, reduced) matrix: NumPy sums its rows pairwise."""
    keep = [i for i in range(ra.ndim) if i not in axes]
    m = math.prod(ra.shape[i] for i in keep)
    n = math.prod(ra.shape[i] for i in axes)
    return np.ascontiguousarray(np.transpose(ra, keep + list(axes))).reshape(m, n)


def upload_view(handler, data, off, r):
    """A view at element ``off`` of a handler buffer holding random values
    around ``data``; returns the view and the float64 values it holds."""
    host = np.concatenate([rand((off,), r), data.reshape(-1), rand((2,), r)])
    buf = handler.create_from_numpy(host)
    return handler.view_t(buf, off, data.shape), as_handler_values(handler, data)


def output_view(handler, shape, off, r):
    """(buffer, view at element ``off`` of it): the view poisoned with NaN,
    the rest of the buffer random (its float64 values returned too)."""
    size = math.prod(shape)
    host = rand((off + size + 3,), r)
    host[off:off + size] = np.nan
    buf = handler.create_from_numpy(host)
    return buf, handler.view_t(buf, off, shape), as_handler_values(handler, host)


# =========================================================================== checks
def sum_tolerance(handler, want, abs_sum, n, mean):
    """Allowed |got - want| per result of ``sum_t`` (``mean_t`` if ``mean``).

    The accumulation, in float32 for the half formats and in the format
    otherwise (unit roundoff u): LAMBDA * u * sqrt(n) * sum|x|; the reference's
    pairwise float64 sum: (20 + log2 n) * 2^-53 * sum|x|.  A mean divides
    both by n and adds three roundings of the accumulator (the sum, 1/n and
    their product).  Then the one rounding to the output format: a unit
    roundoff of it, relative to the accumulated value (within ``acc`` of
    ``want``), or its smallest subnormal step.
    """
    dt = np.dtype(handler.dtype)
    u_acc = dtypes.unit_roundoff(dtypes.compute_dtype(dt))
    u_out = dtypes.unit_roundoff(dt)
    acc = (LAMBDA * u_acc * math.sqrt(n) + (20 + math.log2(max(n, 1))) * 2.0 ** -53) * abs_sum
    scale = 1.01 * u_out
    if mean:
        acc, scale = acc / max(n, 1), scale + 3 * u_acc
    return acc + scale * (np.abs(want) + acc) + dtypes.smallest_subnormal(dt)


def _where(got, want, bad, what):
    i = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape) if bad.ndim else ()
    return (f"{what}: {int(bad.sum())} of {bad.size} results wrong; first at {i}: "
            f"got {got[i]!r}, expected {want[i]!r}")


def assert_bits_equal(got, want, what):
    """``got`` (the handler's format) equal to ``want`` (float64, exact in
    that format) bit for bit; NaN where ``want`` is NaN (any NaN bits)."""
    want_f = want.astype(got.dtype)
    nan_got, nan_want = np.isnan(got.astype(np.float64)), np.isnan(want)
    uint = np.dtype(f"u{got.dtype.itemsize}")
    bad = (nan_got != nan_want) | (~nan_want & (got.view(uint) != want_f.view(uint)))
    assert not bad.any(), _where(got, want_f, bad, what)


def run_case(handler, rng, case):
    """Run ``case`` on ``handler`` with fresh data from ``rng``; check it."""
    op, shape = case.op, case.shape
    axes = reduced_axes(shape, case.axis)
    n = math.prod(shape[i] for i in axes)
    what = f"{op} on {handler!r}, case {case.id}"
    dt = np.dtype(handler.dtype)
    if op == "argmax_t" and n - 1 > dtypes.exact_integers(dt):
        # The contract refuses an index that would not be exact, before writing:
        # "Ops that store indices as floats refuse, with a ValueError before
        # writing, when an index would not be exact" (handler_contract.rst).
        a = handler.view_t(handler.zeros((math.prod(shape) + case.in_off,)), case.in_off,
                           shape)
        buf, out, buf_ref = output_view(handler, case.out_shape, case.out_off, rng)
        with pytest.raises(ValueError, match=rf"argmax_t: axis \d+ of .* has {n} elements, "
                                             r"too many for \w+ indices"):
            handler.argmax_t(a, case.axis, out)
        assert_unchanged(handler, buf, buf_ref, "out's buffer")
        return
    data = draw(case.kind, shape, data_bound(op, case.kind, n, dt), n, rng)
    if op == "sum_t" and dtypes.is_half(dt) and data.size and n:
        # keep each sum within the format's range (a power of two: ints stay exact)
        top = float(np.nanmax(np.abs(data).sum(axis=axes)))
        if top > dtypes.largest(dt) / 8:
            data = data * 2.0 ** -math.ceil(math.log2(top * 8 / dtypes.largest(dt)))
    a, ra = upload_view(handler, data, case.in_off, rng)
    buf, out, buf_ref = output_view(handler, case.out_shape, case.out_off, rng)
    assert getattr(handler, op)(a, case.axis, out) is None
    rows = as_rows(ra, axes)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # a mean over nothing is NaN
        if op in SUMS:
            want = rows.sum(axis=1) / (n if op == "mean_t" else 1)
        elif op == "argmax_t":
            want = np.argmax(rows, axis=1).astype(np.float64)
        else:
            want = getattr(np, op[:-2])(rows, axis=1)
    want = want.reshape(case.out_shape)
    got = handler.get_numpy_copy(out)
    assert got.dtype == dt and got.shape == case.out_shape, (what, got.dtype, got.shape)
    # the output's buffer outside the output, and the input, are untouched
    rest = handler.get_numpy_copy(buf).astype(np.float64)
    off, size = case.out_off, got.size
    outside = np.concatenate([rest[:off], rest[off + size:]])
    np.testing.assert_array_equal(
        outside, np.concatenate([buf_ref[:off], buf_ref[off + size:]]),
        err_msg=f"{what}: wrote outside out")
    assert_unchanged(handler, a, ra, "a")
    exact_sum = op == "sum_t" and case.kind == "ints"
    if op in EXTREMES:
        assert_bits_equal(got, want, what)
        return
    if exact_sum:   # every order of float32 or float64 additions gives the exact sum
        want_f = want.astype(dt)        # rounded once, to the output format
        bad = got != want_f
        assert not bad.any(), _where(got, want_f, bad, what + " (an exact sum)")
        return
    abs_sum = np.abs(rows).sum(axis=1).reshape(case.out_shape)
    tol = sum_tolerance(handler, want, abs_sum, n, op == "mean_t")
    g = got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(g - want) <= tol) & ~(np.isnan(g) & np.isnan(want))
    assert not bad.any(), _where(g, want, bad, what) + f" (tolerance {tol.max():.3g})"


# =========================================================================== tests
@params(RANDOM)
def test_random_case(handler, rng, case):
    run_case(handler, rng, case)


@params(LAYOUT)
def test_layout(handler, rng, case):
    run_case(handler, rng, case)


@params(LARGE_CASES)
def test_large_on_gpu(handler, rng, case):
    if type(handler).__name__ != "PyCudaHandler":
        pytest.skip("GPU-only size (up to 16M elements)")
    run_case(handler, rng, case)


#: Small slabs of a reduced axis longer than THREAD_ROW, run with WALK_MOST
#: and WALK_COLS raised so that ``*_walk`` takes them all (the tree's bounds
#: send only some): trips of 8 with a partial last one, a column's elements
#: ``inner`` apart
WALK = [("walk", (999, 9, 2), 1), ("walk", (300, 12, 3), 1), ("walk", (77, 40, 5), 1),
        ("walk", (61, 100, 16), 1), ("walk", (45, 64, 30), -2),
        ("walk-canon", (50, 1, 17, 31), 2)]   # (50, 17, 31) over 1


@params(layout_cases(WALK, LAYOUT_KINDS))
def test_walk_columns(handler, rng, case, monkeypatch):
    from handlers.cuda import reductions
    monkeypatch.setattr(reductions, "WALK_MOST", 128)
    monkeypatch.setattr(reductions, "WALK_COLS", 32)
    run_case(handler, rng, case)


EMPTY = [  # (shape, axis): sums of nothing, and reductions with no result
    ((3, 0, 4), (0, 1)), ((0,), 0), ((0,), None), ((5, 0), 1), ((2, 0, 3), None),
    ((0, 5), 1), ((4, 0, 3), 2), ((0, 7, 2), (1, 2)),
]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape,axis", EMPTY,
                         ids=[f"{shape_id(s)}-{axis_id(a)}" for s, a in EMPTY])
def test_empty(handler, rng, op, shape, axis):
    """Sums over an empty axis are 0, means NaN (``mean_t``'s doc: "The mean
    over an empty axis is NaN"); ``max_t``, ``min_t`` and ``argmax_t`` refuse
    an empty axis with ValueError ("The axis must not be empty"), before
    writing; an empty output is fine for all of them, and nothing is written."""
    if op in EXTREMES and (axis is None or isinstance(axis, tuple)):
        pytest.skip("max_t, min_t and argmax_t take one int axis")
    case = Case(op, shape, axis, out_shape_of(shape, axis, False), "pm1", 1, 1, "empty")
    if op in EXTREMES and shape[axis] == 0:
        a = handler.view_t(handler.create_from_numpy(rand((3,), rng)), 1, shape)
        buf, out, buf_ref = output_view(handler, case.out_shape, 1, rng)
        with pytest.raises(ValueError, match=rf"{op}: axis \d+ of .* is empty"):
            getattr(handler, op)(a, axis, out)
        assert_unchanged(handler, buf, buf_ref, "out's buffer")
        return
    run_case(handler, rng, case)


@pytest.mark.parametrize("op", EXTREMES)
@pytest.mark.parametrize("axis", [None, (1,), (0, 1)], ids=["None", "1tuple", "2tuple"])
def test_extremes_take_one_int_axis(handler, rng, op, axis):
    """``max_t``, ``min_t``, ``argmax_t``: "along ``axis`` (one int, negative
    counting from the end)"; None or a tuple is a TypeError, before writing."""
    a, _ = upload_view(handler, rand((4, 6), rng), 1, rng)
    out_shape = (1, 1) if axis is None or len(axis) == 2 else (4,)
    buf, out, buf_ref = output_view(handler, out_shape, 1, rng)
    with pytest.raises(TypeError, match=rf"{op}: axis must be an int"):
        getattr(handler, op)(a, axis, out)
    assert_unchanged(handler, buf, buf_ref, "out's buffer")


@pytest.mark.parametrize("extra", [1, 2], ids=["at-limit", "past-limit"])
def test_argmax_index_limit(handler, rng, extra):
    """``argmax_t`` along an axis of exact_integers + 1 elements (the last
    index exact: 2049 in float16, 257 in bfloat16, 2^24 + 1 in float32) works,
    with the first maximum last; one more element is refused before writing
    (the contract: "Ops that store indices as floats refuse, with a
    ValueError before writing, when an index would not be exact")."""
    dt = np.dtype(handler.dtype)
    limit = dtypes.exact_integers(dt)
    if limit > 2 ** 24:
        pytest.skip(f"{dt} indices are exact beyond any axis here")
    if limit == 2 ** 24 and type(handler).__name__ != "PyCudaHandler":
        pytest.skip("GPU-only size (2^24 + 2 elements)")
    n = limit + extra
    buf, out, buf_ref = output_view(handler, (2, 1), 1, rng)
    if extra == 2:
        a = handler.view_t(handler.zeros((2 * n + 1,)), 1, (2, n))
        with pytest.raises(ValueError, match=rf"argmax_t: axis 1 of \(2, {n}\) has {n} "
                                             r"elements, too many for \w+ indices"):
            handler.argmax_t(a, -1, out)
        assert_unchanged(handler, buf, buf_ref, "out's buffer")
        return
    host = rng.integers(-3, 3, (2, n)).astype(np.float64)   # ties everywhere below 3
    host[0, -1] = 3.0                                     # the maximum, last
    host[1, [n // 2, -1]] = 3.0                           # two: the first one counts
    a, _ = upload_view(handler, host, 1, rng)
    handler.argmax_t(a, -1, out)
    assert_bits_equal(handler.get_numpy_copy(out), np.array([[n - 1.0], [n // 2]]),
                      f"argmax_t on {handler!r} over {n}")


#: (tag, shape, axis) of the special-value cases: rows short and long, a
#: 1-D scalar, columns whose rows are 16-byte aligned or not, many or few
SPECIAL = [("short", (1000, 5), 1), ("rows", (7, 333), 1), ("long", (3, 70001), -1),
           ("scalar1d", (65537,), 0), ("cols", (33, 64), 0), ("cols-odd", (33, 63), 0),
           ("cols-many", (4097, 3), 0), ("cols-mid", (5, 301, 7), 1), ("slab", (41, 100, 3), 1)]
#: what a slice holds, in turn (see special_slice)
SCENARIOS = ("zeros", "zeros-neg", "zeros-pos", "-inf", "+inf", "infs", "infs-nan", "ties",
             "nan-first", "numbers")


def special_slice(scenario, n, r):
    """n host values of ``scenario``: ``zeros`` signed zeros alone (both
    signs when n > 1); ``zeros-neg`` signed zeros and negative numbers (the
    max is a zero); ``zeros-pos`` signed zeros and positive ones (the min is
    a zero); ``-inf`` / ``+inf`` that infinity alone; ``infs`` both
    infinities among numbers; ``infs-nan`` the same with one NaN;
    ``ties`` small whole numbers, the largest and the smallest several
    times; ``nan-first`` NaN first, then numbers; ``numbers`` numbers in
    [-1, 1) (no zero)."""
    zeros = np.where(r.random(n) < 0.5, -0.0, 0.0)
    if n > 1:
        zeros[r.permutation(n)[:2]] = (-0.0, 0.0)
    if scenario == "zeros":
        return zeros
    if scenario in ("zeros-neg", "zeros-pos"):
        x = np.abs(rand((n,), r)) * (-1 if scenario == "zeros-neg" else 1)
        at = r.random(n) < 0.5
        at[int(r.integers(n))] = True
        x[at] = zeros[at]
        return x
    if scenario in ("-inf", "+inf"):
        return np.full(n, -np.inf if scenario == "-inf" else np.inf)
    if scenario.startswith("infs"):
        x = rand((n,), r)
        at = r.permutation(n)
        x[at[: max(1, n // 4)]] = -np.inf
        x[at[max(1, n // 4): max(2, n // 2)]] = np.inf
        if scenario == "infs-nan":
            x[int(r.integers(n))] = np.nan
        return x
    if scenario == "ties":
        return r.integers(-2, 3, n).astype(np.float64)
    x = rand((n,), r)
    if scenario == "nan-first":
        x[0] = np.nan
    return x


@pytest.mark.parametrize("op", EXTREMES)
@pytest.mark.parametrize("tag,shape,axis", SPECIAL, ids=[t for t, _, _ in SPECIAL])
@pytest.mark.parametrize("in_off", [0, 1])
def test_extremes_special_values(handler, rng, op, tag, shape, axis, in_off):
    """``max_t``, ``min_t`` and ``argmax_t`` on slices of signed zeros,
    infinities (alone: a slice of -inf has the max -inf), NaN among them,
    ties and NaN first (:func:`special_slice`, the scenarios in turn over
    the slices).  NaN wins; argmax is NumPy's (the first of equal maxima,
    -0.0 and +0.0 equal, or the first NaN), exactly; max and min are the
    element bit for bit, but a zero result may be either zero (they are
    equal: which one the contract leaves open)."""
    ax = axis % len(shape)
    n = shape[ax]
    if op == "argmax_t" and n - 1 > dtypes.exact_integers(np.dtype(handler.dtype)):
        pytest.skip("argmax_t refuses indices inexact in the format (test_argmax_index_limit)")
    kept = tuple(d for i, d in enumerate(shape) if i != ax)
    rows = np.stack([special_slice(SCENARIOS[k % len(SCENARIOS)], n, rng)
                     for k in range(math.prod(kept))])
    data = np.moveaxis(rows.reshape(kept + (n,)), -1, ax)
    a, ra = upload_view(handler, data, in_off, rng)
    buf, out, _ = output_view(handler, kept, 1, rng)
    getattr(handler, op)(a, axis, out)
    got = handler.get_numpy_copy(out)
    ref = np.moveaxis(ra, ax, -1).reshape(-1, n)
    what = f"{op} on {handler!r}, {tag} {shape} axis {axis}"
    if op == "argmax_t":
        assert_bits_equal(got, np.argmax(ref, axis=1).astype(np.float64).reshape(kept), what)
        return
    want = getattr(np, op[:-2])(ref, axis=1).reshape(kept)
    zero = want == 0
    g = got.astype(np.float64)
    assert not (zero & (g != 0)).any(), _where(g, want, zero & (g != 0), what + " (a zero)")
    assert_bits_equal(np.where(zero, np.zeros_like(got), got), np.where(zero, 0.0, want), what)


def test_cases_are_stable_and_cover_the_layouts():
    """The ids are a function of the master seed alone (a failure names a
    case that reruns), unique, and every op meets every layout it takes."""
    assert [c.id for c in random_cases()] == [c.id for c in RANDOM]
    for cases in (RANDOM, LAYOUT, LARGE_CASES):
        assert len({c.id for c in cases}) == len(cases)
    assert all(math.prod(c.shape) <= BUDGET for c in RANDOM)
    every = {"rows2", "rows33", "rows64", "rows-canon", "medium", "long", "scalar1d",
             "scalar-canon", "cols-few", "cols-many", "cols-canon", "cols-mid", "cols-odd",
             "cols-odd-canon", "slab", "slab-canon"}
    sums_only = {"rows-merged", "medium-merged", "scalar-merged", "cols-merged", "mid",
                 "mid-canon", "three-runs", "gen-rkrk", "gen-rkrk-vec", "gen-krkr",
                 "gen-krkr-short", "gen-krkrk", "gen-rkrkr", "gen-4runs", "gen-4runs-k",
                 "gen-chunked", "gen-krkr-long", "gen-canon", "passes-5runs"}
    for op in OPS:
        assert sum(c.op == op for c in RANDOM) == RANDOM_CASES
        tags = {c.tag for c in LAYOUT if c.op == op}
        assert tags >= (every | sums_only if op in SUMS else every), op
        assert len({c.kind for c in RANDOM if c.op == op}) == 4
    assert any(isinstance(c.axis, tuple) and len(c.axis) > 1 for c in RANDOM)
    assert any(c.axis is None for c in RANDOM)
    assert any(isinstance(c.axis, int) and c.axis < 0 for c in RANDOM)


#: (tag, shape, axis) of the argmax packet cases: every kernel of argmax
#: (short, rows, long, a 1-D long one, columns of packets and of scalars)
ARGMAX_PACKETS = [("short", (300, 40), 1), ("rows", (9, 1001), 1), ("long", (2, 100003), 1),
                  ("scalar1d", (200003,), 0), ("cols-vec", (257, 48), 0),
                  ("cols-odd", (129, 37), 0), ("cols-mid", (3, 250, 16), 1),
                  ("slab", (50, 129, 2), 1)]


@pytest.mark.parametrize("tag,shape,axis", ARGMAX_PACKETS, ids=[t for t, _, _ in ARGMAX_PACKETS])
@pytest.mark.parametrize("in_off", [0, 1])
def test_argmax_ties_and_nan_in_packets(handler, rng, tag, shape, axis, in_off):
    """``argmax_t`` picks a 16-byte packet's first best element and then
    meets the state once (reduce.cu's Pick::add_packet): slices of -1, -0.0,
    +0.0 and 1 with the maximum 2 at a few places (ties within one packet
    and across packets), zeros alone (-0.0 and +0.0 tie), and two NaNs
    (the first wins) are NumPy's argmax exactly, in every layout."""
    n = shape[axis]
    if n - 1 > dtypes.exact_integers(np.dtype(handler.dtype)):
        pytest.skip("argmax_t refuses indices inexact in the format (test_argmax_index_limit)")
    kept = tuple(d for i, d in enumerate(shape) if i != axis)
    rows = np.array([-1.0, -0.0, 0.0, 1.0])[rng.integers(0, 4, (math.prod(kept), n))]
    for k, row in enumerate(rows):
        at = rng.integers(0, n, 3)
        if k % 3 == 0:     # a run of ties: first at a random packet lane
            row[at[0]: at[0] + 4] = 2.0
            row[at[1]] = 2.0
        elif k % 3 == 1:   # two NaNs, maybe in one packet, and maxima around
            row[at] = 2.0
            row[at[0]] = row[min(n - 1, at[0] + int(rng.integers(1, 3)))] = np.nan
        else:              # zeros of both signs alone
            row[:] = np.where(rng.random(n) < 0.5, -0.0, 0.0)
    data = np.moveaxis(rows.reshape(kept + (n,)), -1, axis)
    a, ra = upload_view(handler, data, in_off, rng)
    buf, out, _ = output_view(handler, kept, 1, rng)
    handler.argmax_t(a, axis, out)
    got = handler.get_numpy_copy(out)
    ref = np.moveaxis(ra, axis, -1).reshape(-1, n)
    assert_bits_equal(got, np.argmax(ref, axis=1).astype(np.float64).reshape(kept),
                      f"argmax_t on {handler!r}, {tag} {shape} axis {axis}")
