"""``python -m benchmarks reductions``: the reductions against PyTorch and CuPy (issue 41).

Measured in one process on one GPU, every library fed the same host data and
timed in interleaved order (:func:`benchmarks.gpu.interleaved`), ``LOOP``
calls back to back between two CUDA events after warm-up, median of the
repeats.  Each case cycles through enough copies of its input to hold twice
the L2 cache (:func:`benchmarks.ops.inputs_beyond_l2`), so that every call
reads its input from DRAM, as the device copy it is compared with does.
Bandwidth counts the minimal bytes (the input read once, the output written
once), the same for every library.  Sections:

* **a random set**: ``--seed`` (drawn from the clock unless given, once per
  process; printed and saved) draws ``--cases`` cases (:func:`draw_cases`):
  an op uniform over ``sum_t``, ``mean_t``, ``max_t``, ``min_t`` and
  ``argmax_t`` (whose indices must be exact in the format); rank 1 to 4;
  input bytes log-uniform between 64 KB and 256 MB; extents mixing tiny ones
  (1-4), primes and large ones, one large extent scaled to the byte budget;
  the reduced axes one int axis, a sorted tuple of several (``sum_t`` and
  ``mean_t`` only) or None (all).  Targets: every case at >= 0.95x
  PyTorch's speed (PyTorch's time / ours), the median at >= 1.1x, and the
  median over the inputs above 64 MB at >= 80% of the copy bandwidth,
  beside what bounds it: a kernel that only reads each such input
  (:func:`bound_large_inputs`);
* **fixed rows**: the conv suite's reductions (the bias gradient and
  ``mean_t`` of (64, 128, 32, 32) over (0, 2, 3); ``max_t``, ``min_t`` and
  ``argmax_t`` of (8192, 4096)), target >= 1.0x PyTorch; and the regressions
  that issue 41 names, target >= 0.95x PyTorch as in the random set;
* **fused rows**, float32, no target: ``softmax_m``, softmax cross-entropy
  forward and gradient (``layers.SoftmaxCrossEntropy``) and ``LayerNorm``
  forward and backward at (8192, 4096), (32768, 1000) and (4096, 50257):
  ours against PyTorch eager and ``torch.compile`` (its compile time
  reported apart, never in a timed figure), as fractions of copy on the
  minimal bytes.  What PyTorch cannot run (``torch.compile`` failing, say) is
  recorded and left out.

The max, min and argmax ops take one int axis: where a case reduces them
over None (everything), every library reduces a flat view of the input along
its one axis, which is the same work.  PyTorch and CuPy reduce a flat view
for every None case, ``sum_t`` and ``mean_t`` included (ours gets None).
Outputs drop the reduced axes (PyTorch's ``keepdim=False``); every library
writes into an output allocated before the clock starts.  For tiny inputs a
call costs its launch more than its bytes, for ours and the peers alike.

Every case is checked against NumPy in float64 (``checks`` in the saved run):
sums and means within a tolerance (:func:`sum_tolerance`) relative to the
sum (or mean) of |x| over the reduced axes, max and min exactly, argmax by
the index (ours: NumPy's, the first of equal maxima; a peer: any index
holding the maximum).

Without a GPU this prints that it skipped and returns 0; ``--handler numpy``
runs every section on NumpyHandler at tiny sizes, on the host clock, without
peers (a smoke test of the code, not a measurement).
"""
import argparse
import math
import statistics
import time
from collections import namedtuple
from types import SimpleNamespace

import numpy as np

from benchmarks.common import (
    Run,
    derive,
    finish,
    gpu_name,
    print_table,
    rel_error,
    suite_parser,
)
from benchmarks.gpu import EventTimer, cuda_handler, interleaved, optional_peers
from benchmarks.ops import (
    LOOP,
    Lib,
    _check,
    _nan,
    _ratio,
    copy_spread,
    inputs_beyond_l2,
    libraries,
    read_only_ms,
)
from benchmarks.train import HostTimer
from handlers import dtypes

MB = 1 << 20
#: issue 41's targets: every random case >= EVERY_TARGET x PyTorch's speed, their
#: median >= MEDIAN_TARGET x, inputs above BIG_INPUT at >= COPY_TARGET of copy
EVERY_TARGET, MEDIAN_TARGET, COPY_TARGET, BIG_INPUT = 0.95, 1.1, 0.80, 64 * MB
CONV_TARGET = 1.0            # the conv suite's shapes: at least PyTorch's speed
OPS = ("sum_t", "mean_t", "max_t", "min_t", "argmax_t")
EXTREMES = ("max_t", "min_t", "argmax_t")
#: the same reduction in PyTorch and in CuPy (both spell them alike)
PEER_NAMES = {"sum_t": "sum", "mean_t": "mean", "max_t": "amax", "min_t": "amin",
              "argmax_t": "argmax"}
RANDOM_BYTES = (64 << 10, 256 * MB)        # the random set's input bytes, log-uniform
SMOKE_BYTES = (4 << 10, 256 << 10)         # the same with --handler numpy
DEFAULT_CASES, QUICK_CASES = 48, 6
#: (op, shape, axis) of the conv suite's reductions (benchmarks/conv.py)
CONV_ROWS = [("sum_t", (64, 128, 32, 32), (0, 2, 3)), ("mean_t", (64, 128, 32, 32), (0, 2, 3)),
             ("max_t", (8192, 4096), 0), ("max_t", (8192, 4096), 1),
             ("min_t", (8192, 4096), 0), ("min_t", (8192, 4096), 1),
             ("argmax_t", (8192, 4096), 1)]
#: the regressions issue 41 names; its max_t (8192, 4096) axes 0 and 1 and
#: argmax_t (8192, 4096) axis 1 are CONV_ROWS above, under their stricter target
REGRESSIONS = [("sum_t", (400, 70348, 2), 2), ("sum_t", (42, 322763), 0),
               ("sum_t", (12, 11135, 344), 0), ("sum_t", (5, 1675841), 1),
               ("sum_t", (1048576, 16), 0), ("min_t", (8859584,), None),
               ("argmax_t", (5, 1154496), 1), ("mean_t", (6, 1, 3, 2753005), (0, 2, 3)),
               ("max_t", (14593181, 2), 1), ("mean_t", (81, 1, 16960, 3), 3)]
FUSED_SHAPES = ((8192, 4096), (32768, 1000), (4096, 50257))
SMOKE_FUSED_SHAPES = ((64, 40), (33, 17))
LN_EPS = 1e-5
#: relative tolerances of the fused rows against float64: LayerNorm's backward
#: sums over up to 32768 rows and subtracts nearly equal terms
SOFTMAX_TOL, LAYERNORM_TOL = 1e-5, 1e-4


# ------------------------------------------------------------------ the random set
def _primes(limit):
    """The primes up to ``limit`` (a sieve), as an int array."""
    sieve = np.ones(limit + 1, bool)
    sieve[:2] = False
    for p in range(2, math.isqrt(limit) + 1):
        if sieve[p]:
            sieve[p * p::p] = False
    return np.flatnonzero(sieve)


#: enough primes for trial division of any extent up to 2^28 elements
PRIMES = _primes(1 << 14)


def next_prime(n):
    """The smallest prime >= ``n`` (for ``n`` below 2^28)."""
    n = max(2, int(n))
    while not np.all(n % PRIMES[PRIMES * PRIMES <= n]):
        n += 1
    return n


def _extent(rng, family):
    """One extent of ``family``: tiny (1-4), a prime (5 to about 8K, log-uniform)
    or large (256 to 8K: a power of two or any value, log-uniform)."""
    if family == "tiny":
        return int(rng.integers(1, 5))
    if family == "prime":
        return int(PRIMES[np.searchsorted(PRIMES, 2 ** rng.uniform(2.3, 13))])
    if rng.random() < 0.5:
        return 1 << int(rng.integers(8, 14))
    return int(2 ** rng.uniform(8, 13))


def _draw_shape(rng, lo, hi):
    """A shape of ``lo`` to ``hi`` elements, or None where the draw cannot fit
    them: rank 1 to 4, each extent of a random family, then one large extent
    (or any, where none is large) scaled to a log-uniform element count, and
    half the time moved up to a prime (odd sizes leave tails)."""
    target = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    rank = int(rng.integers(1, 5))
    families = [("tiny", "prime", "large")[int(k)] for k in rng.integers(0, 3, rank)]
    large = [i for i, f in enumerate(families) if f == "large"] or list(range(rank))
    big = large[int(rng.integers(len(large)))]
    shape = [_extent(rng, f) for f in families]
    rest = math.prod(d for i, d in enumerate(shape) if i != big)
    low, high = max(1, -(-lo // rest)), hi // rest
    if low > high:
        return None
    n = min(max(int(round(target / rest)), low), high)
    if rng.random() < 0.5 and next_prime(n) <= high:
        n = next_prime(n)
    shape[big] = n
    return tuple(shape)


def reduced_count(shape, axis):
    """How many elements each result of reducing ``shape`` over ``axis`` (None,
    an int or a tuple) takes in."""
    if axis is None:
        return math.prod(shape)
    return math.prod(shape[i] for i in (axis if isinstance(axis, tuple) else (axis,)))


def _draw_axis(rng, op, shape, limit):
    """The reduced axes of one case: None a quarter of the time; for ``sum_t``
    and ``mean_t`` of rank >= 2 a sorted tuple of two or more axes another
    quarter; else one int axis.  ``argmax_t`` needs indices up to ``limit``
    (exact in the format): None where a few draws find no axis that fits."""
    rank = len(shape)
    for _ in range(16):
        u = rng.random()
        if u < 0.25:
            axis = None
        elif u < 0.5 and op in ("sum_t", "mean_t") and rank >= 2:
            k = int(rng.integers(2, rank + 1))
            axis = tuple(sorted(int(a) for a in rng.choice(rank, k, replace=False)))
        else:
            axis = int(rng.integers(rank))
        if op != "argmax_t" or reduced_count(shape, axis) - 1 <= limit:
            return (axis,)
    return None


def draw_cases(seed, count, nbytes=RANDOM_BYTES, dtype=np.float32):
    """The random set: ``count`` cases ``{op, shape, axis}`` drawn from
    ``seed``, each input of ``nbytes[0]`` to ``nbytes[1]`` bytes in ``dtype``
    (see the module docstring).  The same arguments give the same cases."""
    rng = np.random.default_rng(seed)
    dt = dtypes.resolve(dtype)
    lo, hi = (b // dt.itemsize for b in nbytes)
    limit = dtypes.exact_integers(dt)
    cases = []
    while len(cases) < count:
        op = OPS[int(rng.integers(len(OPS)))]
        for _ in range(100):      # a shape and an axis that fit this op
            shape = _draw_shape(rng, lo, hi)
            axis = None if shape is None else _draw_axis(rng, op, shape, limit)
            if axis is not None:
                cases.append(dict(op=op, shape=shape, axis=axis[0]))
                break
    return cases


def sum_tolerance(count, dtype):
    """Tolerance of a sum or mean of ``count`` elements against float64,
    relative to the sum (or mean) of |x| over the reduced axes (``_errors``):
    4 * u * log2(count), at least 4 * u, for u the unit roundoff of the
    format that accumulates (float32 for the halves): a tree of additions
    errs by at most about u * log2(count) of that sum, and every library here
    adds in trees of short runs.  Plus four roundings of the output for a
    half format (its inputs are exact, being the data).  A result that drops
    a handful of random-sign terms of a million misses it."""
    tol = 4 * dtypes.unit_roundoff(dtypes.compute_dtype(dtype)) * max(1.0, math.log2(count))
    if dtypes.is_half(dtype):
        tol += 4 * dtypes.unit_roundoff(dtype)
    return tol


# ------------------------------------------------------------------ one reduction case
def _axis_text(axis):
    return "None" if axis is None else str(axis)


def _json_axis(axis):
    return list(axis) if isinstance(axis, tuple) else axis


def _out_shape(shape, axis):
    """The result's shape: ``shape`` without the reduced axes."""
    axes = range(len(shape)) if axis is None else axis if isinstance(axis, tuple) else (axis,)
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _torch_dtype(torch, dtype):
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
            "f64": torch.float64}[dtypes.short_name(dtype)]


def _call(name, lib, op, axis):
    """fn(x, out) of library ``name`` reducing x over ``axis`` (0 for a flat view)."""
    if name == "ours":
        f = getattr(lib.mod, op)
        return lambda x, o: f(x, axis, o)
    f = getattr(lib.mod, PEER_NAMES[op])
    if name == "torch":
        return lambda x, o: f(x, dim=axis, out=o)
    if op == "min_t":
        # CuPy's min with out= fails in its CUB path (cupy/cupy issue 9032,
        # open): its result is copied into o instead, a copy of the output
        # that its time includes.
        return lambda x, o: o.__setitem__(Ellipsis, f(x, axis=axis))
    return lambda x, o: f(x, axis=axis, out=o)


def _flat(name, lib, x, n):
    """A 1-D view of library ``name``'s array ``x`` of ``n`` elements."""
    if name == "ours":
        return lib.mod.reshape_t(x, (n,))
    return x.view(-1) if name == "torch" else x.reshape(-1)


def _alloc(name, lib, shape, index, dtype):
    """An output of ``shape`` for library ``name``: int64 for a peer's argmax."""
    if name == "ours":
        return lib.mod.allocate(shape)
    if name == "torch":
        t = lib.mod
        return t.empty(shape, dtype=t.int64 if index else _torch_dtype(t, dtype), device="cuda")
    return lib.mod.empty(shape, dtype=np.int64 if index else dtype)


def _errors(op, x32, axis, got, count, dtype):
    """({library: error}, tolerance, against) of each library's result
    ``got`` against NumPy on ``x32`` (the data in float32, exact), reduced
    over ``axis`` (an int where ``x32`` is flat for a None case)."""
    if op in ("sum_t", "mean_t"):
        # Relative to the sum of |x| (the mean of |x| for a mean), which
        # bounds a float sum's rounding error, not to the result: relative
        # to itself, a sum of many random-sign terms is small (a mean of
        # 49.5M normals, 1.4e-4) and CuPy's correct result failed.
        reduce = getattr(np, op[:-2])
        ref = reduce(x32, axis=axis, dtype=np.float64)
        scale = float(np.max(reduce(np.abs(x32), axis=axis, dtype=np.float64), initial=0.0))
        errors = {}
        for k, v in got.items():
            err = float(np.max(np.abs(np.asarray(v, np.float64) - ref), initial=0.0))
            errors[k] = float("inf") if not np.isfinite(err) else err / (scale or 1.0)
        return errors, sum_tolerance(count, dtype), "float64 NumPy, over the sum of |x|"

    if op != "argmax_t":
        ref = getattr(np, op[:-2])(x32, axis=axis)
        return {k: rel_error(v, ref) for k, v in got.items()}, 0.0, "NumPy (exact)"
    ref = np.argmax(x32, axis=axis)
    rows = np.moveaxis(x32, axis, -1)
    best = np.max(rows, axis=-1)
    errors = {}
    for k, v in got.items():
        idx = np.rint(np.asarray(v, np.float64)).astype(np.int64)
        wrong = idx != ref
        if k != "ours":      # a peer may name any index that holds the maximum
            held = np.take_along_axis(rows, np.clip(idx, 0, rows.shape[-1] - 1)[..., None], -1)
            wrong &= held[..., 0] != best
        errors[k] = float(np.mean(wrong))
    return errors, 0.0, "NumPy (argmax: share of wrong indices)"


def _first_line(e):
    """An exception as one line: its type and the first line of its message."""
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


def measure_case(env, case, host, host32, reps, which, target, checks):
    """Time and check one reduction ``case`` ({op, shape, axis}) on every
    library of ``env``; ``host`` holds the input in the format measured and
    ``host32`` the same values in float32.  Returns the case's row."""
    op, shape, axis = case["op"], tuple(case["shape"]), case["axis"]
    n = math.prod(shape)
    oshape = _out_shape(shape, axis)
    itemsize = env.dtype.itemsize
    n_in = env.inputs(host.nbytes)
    fns, outs = {}, {}
    for name, lib in env.libs.items():
        # A flat view for every peer's None case, and for ours where the op
        # takes one int axis only.
        flat = axis is None and (name != "ours" or op in EXTREMES)
        xs = [lib.put(host) for _ in range(n_in)]
        if flat:
            xs = [_flat(name, lib, x, n) for x in xs]
        o = outs[name] = _alloc(name, lib, oshape, op == "argmax_t", env.dtype)
        f = _call(name, lib, op, 0 if flat else axis)
        fns[name] = (lib.timer, lambda i, f=f, xs=xs, o=o, k=n_in: f(xs[i % k], o))
    notes = {}
    for name in [k for k in fns if k != "ours"]:     # a peer that cannot run is left out
        try:
            fns[name][1](0)
        except Exception as e:  # recorded in the row and printed
            notes[name] = _first_line(e)
            print(f"{op} {shape} axis {_axis_text(axis)}: {name} left out: {notes[name]}")
            del fns[name], outs[name]
    ms = interleaved(fns, reps=reps, inner=LOOP)
    nbytes = host.nbytes + math.prod(oshape) * itemsize
    bps = {k: derive(v, lambda t: nbytes / (t * 1e-3)) for k, v in ms.items()}
    got = {}
    for name in outs:
        env.libs[name].sync()
        got[name] = env.libs[name].get(outs[name])
    flat_ref = axis is None and op in EXTREMES
    errors, tol, against = _errors(op, host32.reshape(-1) if flat_ref else host32,
                                   0 if flat_ref else axis, got, reduced_count(shape, axis),
                                   env.dtype)
    _check(checks, f"{op} {shape} axis {_axis_text(axis)}", errors, tol, against)
    ours, tm, cm = (ms.get(k, {}).get("median") for k in ("ours", "torch", "cupy"))
    return dict(set=which, op=op, shape=[int(d) for d in shape], axis=_json_axis(axis),
                input_bytes=int(host.nbytes), inputs=int(n_in), ours_ms=ms["ours"],
                torch_ms=ms.get("torch"), cupy_ms=ms.get("cupy"), ours_Bps=bps["ours"],
                fraction_of_copy=bps["ours"]["median"] / env.copy_Bps,
                speed_vs_torch=_ratio(tm, ours), speed_vs_cupy=_ratio(cm, ours), target=target,
                notes=notes)


def _guarded(env, case, host, host32, reps, which, target, checks):
    """:func:`measure_case`, or a row naming the error (and a failed check)
    where a library raises: one bad case does not end the suite."""
    try:
        return measure_case(env, case, host, host32, reps, which, target, checks)
    except Exception as e:  # recorded, printed and judged as a failure
        what = f"{case['op']} {tuple(case['shape'])} axis {_axis_text(case['axis'])}"
        err = _first_line(e)
        print(f"check {what}: FAILED ({err})")
        checks.append(dict(what=what, errors={}, tol=None, ok=False, error=err))
        return dict(set=which, op=case["op"], shape=[int(d) for d in case["shape"]],
                    axis=_json_axis(case["axis"]), input_bytes=int(host.nbytes),
                    target=target, error=err)


def _us(spread):
    return spread["median"] * 1e3 if spread else float("nan")


def _case_cells(row):
    """The table cells of one row: op, shape, axis, MB and the figures."""
    head = [row["op"], str(tuple(row["shape"])),
            _axis_text(tuple(row["axis"]) if isinstance(row["axis"], list) else row["axis"]),
            row["input_bytes"] / MB]
    if "error" in row:
        return head + ["error"] * 7
    return head + [_us(row["ours_ms"]), _us(row.get("torch_ms")), _us(row.get("cupy_ms")),
                   row["ours_Bps"]["median"] / 1e9, row["fraction_of_copy"],
                   _nan(row["speed_vs_torch"]), _nan(row["speed_vs_cupy"])]


CASE_HEADERS = ["op", "shape", "axis", "MB", "ours us", "torch us", "cupy us", "ours GB/s",
                "of copy", "vs torch", "vs cupy"]


def _verdict(ok):
    return "holds" if ok else "MISSES"


def summarize(rows):
    """The random set's figures that issue 41's targets judge: cases below
    ``EVERY_TARGET`` x PyTorch's speed, the median speed, and the median
    fraction of copy of the inputs above ``BIG_INPUT`` bytes (None where
    nothing was measured)."""
    speeds = [r["speed_vs_torch"] for r in rows if r.get("speed_vs_torch") is not None]
    big = [r["fraction_of_copy"] for r in rows
           if r.get("fraction_of_copy") is not None and r["input_bytes"] > BIG_INPUT]
    bound = [r["read_only_fraction"] for r in rows if r.get("read_only_fraction") is not None]
    return dict(cases=len(rows), errors=sum("error" in r for r in rows), compared=len(speeds),
                below=sum(s < EVERY_TARGET for s in speeds),
                median_speed=statistics.median(speeds) if speeds else None,
                big_inputs=len(big), median_big_fraction=statistics.median(big) if big else None,
                median_big_bound=statistics.median(bound) if bound else None)


def print_summary(s):
    """Print the random set's targets, the figures and whether each holds."""
    print(f"targets (issue 41): every case >= {EVERY_TARGET}x PyTorch's speed, the median >= "
          f"{MEDIAN_TARGET}x; inputs above {BIG_INPUT // MB} MB at >= {COPY_TARGET:.0%} of copy")
    if s["compared"]:
        print(f"  cases below {EVERY_TARGET}x torch: {s['below']} of {s['compared']} (target 0): "
              f"{_verdict(s['below'] == 0)}")
        print(f"  median speed vs torch: {s['median_speed']:.3f}x (target >= {MEDIAN_TARGET}x): "
              f"{_verdict(s['median_speed'] >= MEDIAN_TARGET)}")
    else:
        print("  speed vs torch: n/a (PyTorch not available)")
    if s["big_inputs"]:
        print(f"  median fraction of copy, {s['big_inputs']} inputs above {BIG_INPUT // MB} MB: "
              f"{s['median_big_fraction']:.1%} (target >= {COPY_TARGET:.0%}): "
              f"{_verdict(s['median_big_fraction'] >= COPY_TARGET)}")
        if s.get("median_big_bound") is not None:
            print(f"  bound: a kernel that only reads the same inputs, median "
                  f"{s['median_big_bound']:.1%} of copy on the same bytes")
    else:
        print(f"  fraction of copy: n/a (no input above {BIG_INPUT // MB} MB)")
    if s["errors"]:
        print(f"  {s['errors']} case(s) raised: see the checks")


def bound_large_inputs(env, rows, reps):
    """What bounds the large inputs' target: for each row above
    ``BIG_INPUT`` bytes, the read-only kernel (``benchmarks.ops.READ_ONLY``)
    over its input's bytes, timed as the cases are, as a fraction of copy on
    the row's own bytes (``read_only_fraction``): no reduction of that input
    can beat it."""
    for r in rows:
        if "error" in r or r["input_bytes"] <= BIG_INPUT:
            continue
        t = env.read_only(r["input_bytes"], reps)
        nbytes = r["ours_Bps"]["median"] * r["ours_ms"]["median"] * 1e-3   # the row's bytes
        r["read_only_fraction"] = nbytes / (t["median"] * 1e-3) / env.copy_Bps


def _pool(seed, count, dtype):
    """(data in ``dtype``, the same in float32): ``count`` standard normal
    values drawn once from ``seed``, whose prefixes every case reshapes."""
    x32 = np.random.default_rng([seed, 1]).standard_normal(count, dtype=np.float32)
    if dtypes.short_name(dtype) == "f32":
        return x32, x32
    x = x32.astype(dtype)
    return x, x.astype(np.float32)


def random_set(env, seed, count, reps, checks):
    """The random set: draw, measure and check each case, print the table and
    the targets; returns ``{seed, cases, summary}``."""
    cases = draw_cases(seed, count, env.random_bytes, env.dtype)
    pool, pool32 = _pool(seed, max(math.prod(c["shape"]) for c in cases), env.dtype)
    rows = []
    for case in cases:
        n = math.prod(case["shape"])
        rows.append(_guarded(env, case, pool[:n].reshape(case["shape"]),
                             pool32[:n].reshape(case["shape"]), reps, "random", None, checks))
    print(f"\nRandom set, seed {seed}: {count} cases, {env.dtype.name}; {LOOP} calls back to back, "
          f"{env.where}; copy = {env.copy_Bps / 1e12:.3f} TB/s; vs torch = torch's time / ours "
          f"(> 1: ours faster)")
    print_table(["#"] + CASE_HEADERS, [[i] + _case_cells(r) for i, r in enumerate(rows)])
    if env.read_only:
        bound_large_inputs(env, rows, reps)
    summary = summarize(rows)
    print_summary(summary)
    return dict(seed=seed, cases=rows, summary=summary)


def _shrunk(shape, max_elems):
    """``shape`` with its largest extents cut until it holds <= ``max_elems``."""
    shape = list(shape)
    while math.prod(shape) > max_elems:
        i = int(np.argmax(shape))
        shape[i] = max(1, shape[i] * max_elems // math.prod(shape))
    return tuple(shape)


def fixed_rows(env, seed, reps, checks):
    """The conv suite's reductions and issue 41's named regressions, each
    against its target (x PyTorch's speed); prints their table."""
    wanted = [(op, shape, axis, "conv", CONV_TARGET) for op, shape, axis in CONV_ROWS]
    wanted += [(op, shape, axis, "regression", EVERY_TARGET) for op, shape, axis in REGRESSIONS]
    limit = dtypes.exact_integers(env.dtype)
    todo = []
    for op, shape, axis, which, target in wanted:
        shape = _shrunk(shape, env.random_bytes[1] // env.dtype.itemsize)
        if op == "argmax_t" and reduced_count(shape, axis) - 1 > limit:
            print(f"fixed: {op} {shape} axis {axis} left out: its indices are not exact in "
                  f"{env.dtype.name}")
            continue
        todo.append((dict(op=op, shape=shape, axis=axis), which, target))
    pool, pool32 = _pool(seed, max(math.prod(c["shape"]) for c, _, _ in todo), env.dtype)
    rows = []
    for case, which, target in todo:
        n = math.prod(case["shape"])
        rows.append(_guarded(env, case, pool[:n].reshape(case["shape"]),
                             pool32[:n].reshape(case["shape"]), reps, which, target, checks))
    cells = []
    for r in rows:
        s = r.get("speed_vs_torch")
        ok = "-" if s is None else "yes" if s >= r["target"] else "NO"
        cells.append([r["set"]] + _case_cells(r) + [r["target"], ok])
    print(f"\nFixed rows: the conv suite's reductions (target >= {CONV_TARGET}x torch) and "
          f"issue 41's regressions (target >= {EVERY_TARGET}x torch), {env.dtype.name}")
    print_table(["set"] + CASE_HEADERS + ["target", "ok"], cells)
    return rows


# ------------------------------------------------------------------ fused rows
#: one fused row: its minimal bytes; ours(i) -> our output arrays; torch_fn(*args)
#: -> tensors (PyTorch's eager form, and what torch.compile compiles); args(i);
#: eager(i), where PyTorch's eager form is not torch_fn; ref() -> float64 outputs
Fused = namedtuple("Fused", "name nbytes ours torch_fn args eager ref")


def _softmax64(x):
    s = x - x.max(axis=1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=1, keepdims=True)
    return s


def _fused_softmax(env, x):
    """``softmax_m`` against ``torch.softmax(dim=1)``."""
    h, t, k = env.h32, env.torch, env.inputs(x.nbytes)
    xs = [h.create_from_numpy(x) for _ in range(k)]
    out = h.allocate(x.shape)

    def ours(i):
        h.softmax_m(xs[i % k], out)
        return [out]
    torch_fn = args = None
    if t is not None:
        tx = [env.tput(x) for _ in range(k)]

        def torch_fn(a):
            return (t.softmax(a, dim=1),)

        def args(i):
            return (tx[i % k],)
    return Fused("softmax_m", 2 * x.nbytes, ours, torch_fn, args, None,
                 lambda: [_softmax64(x.astype(np.float64))])


def _cross_entropy64(y, labels):
    n = y.shape[0]
    s = y.astype(np.float64)
    s -= s.max(axis=1, keepdims=True)
    s -= np.log(np.exp(s).sum(axis=1, keepdims=True))       # log-probabilities
    loss = -s[np.arange(n), labels].mean()
    np.exp(s, out=s)
    s[np.arange(n), labels] -= 1.0
    s /= n
    return [np.array([loss]), s]


def _fused_cross_entropy(env, y, labels):
    """``SoftmaxCrossEntropy`` forward and gradient against PyTorch's
    ``cross_entropy`` and its gradient through autograd (eager), and an
    explicit forward-and-gradient function (compiled)."""
    from layers import SoftmaxCrossEntropy
    h, t, k = env.h32, env.torch, env.inputs(y.nbytes)
    n, c = y.shape
    loss = SoftmaxCrossEntropy()
    loss.bind(h)
    ys = [h.create_from_numpy(y) for _ in range(k)]
    targets = h.create_from_numpy(labels.astype(np.float32).reshape(n, 1))

    def ours(i):
        value = loss.forward(ys[i % k], targets)
        return [value, loss.backward()]
    torch_fn = args = eager = None
    if t is not None:
        ty = [env.tput(y).requires_grad_() for _ in range(k)]
        plain = [a.detach() for a in ty]
        tl = t.from_numpy(labels).cuda()

        def eager(i):
            yi = ty[i % k]
            value = t.nn.functional.cross_entropy(yi, tl)
            return (value,) + t.autograd.grad(value, yi)

        def torch_fn(a, lab):
            logp = t.log_softmax(a, dim=1)
            p = logp.exp()
            hit = t.arange(a.shape[1], device=a.device) == lab[:, None]
            return -logp.gather(1, lab[:, None]).mean(), t.where(hit, p - 1, p) / a.shape[0]

        def args(i):
            return (plain[i % k], tl)
    # minimal bytes: logits and labels read, the gradient and the loss written
    return Fused("softmax + cross-entropy, forward + gradient", (2 * n * c + n + 1) * 4, ours,
                 torch_fn, args, eager, lambda: _cross_entropy64(y, labels))


def _layernorm64(x, gain, bias, dy=None):
    """LayerNorm's y, or (dx, dgain, dbias) given ``dy``, in float64."""
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    x -= mean
    rstd = 1.0 / np.sqrt((x * x).mean(axis=1, keepdims=True) + LN_EPS)
    x *= rstd                                                    # xhat
    if dy is None:
        return [x * gain + bias]
    dy = dy.astype(np.float64)
    g = dy * gain
    dx = rstd * (g - g.mean(axis=1, keepdims=True) - x * (g * x).mean(axis=1, keepdims=True))
    return [dx, (dy * x).sum(axis=0), dy.sum(axis=0)]


def _layer(env, d, gain, bias):
    """A ``LayerNorm(d)`` bound to the float32 handler with these parameters."""
    from layers import LayerNorm, ParameterSet
    h = env.h32
    layer = LayerNorm(d, eps=LN_EPS)
    layer.bind(h)
    ParameterSet(h, [layer])
    h.set_from_numpy(layer.params["gain"], gain.reshape(1, d))
    h.set_from_numpy(layer.params["bias"], bias.reshape(1, d))
    return layer


def _fused_layernorm_forward(env, x, gain, bias):
    """``LayerNorm.forward`` against ``torch.nn.functional.layer_norm``."""
    h, t, k = env.h32, env.torch, env.inputs(x.nbytes)
    n, d = x.shape
    layer = _layer(env, d, gain, bias)
    xs = [h.create_from_numpy(x) for _ in range(k)]

    def ours(i):
        return [layer.forward(xs[i % k])]
    torch_fn = args = None
    if t is not None:
        tx = [env.tput(x) for _ in range(k)]
        tw, tb = env.tput(gain), env.tput(bias)

        def torch_fn(a, w, b):
            return (t.nn.functional.layer_norm(a, (a.shape[1],), w, b, LN_EPS),)

        def args(i):
            return (tx[i % k], tw, tb)
    return Fused("LayerNorm forward", (2 * n * d + 2 * d) * 4, ours, torch_fn, args, None,
                 lambda: _layernorm64(x, gain, bias))


def _fused_layernorm_backward(env, x, gain, bias, dy):
    """``LayerNorm.backward`` (after one forward) against ATen's
    ``native_layer_norm_backward`` (what autograd calls) on the mean and
    1/std of ``native_layer_norm``."""
    h, t, k = env.h32, env.torch, env.inputs(dy.nbytes)
    n, d = x.shape
    layer = _layer(env, d, gain, bias)
    layer.forward(h.create_from_numpy(x))
    dys = [h.create_from_numpy(dy) for _ in range(k)]

    def ours(i):
        dx = layer.backward(dys[i % k])
        return [dx, layer.grads["gain"], layer.grads["bias"]]
    torch_fn = args = None
    if t is not None:
        tx, tw, tb = env.tput(x), env.tput(gain), env.tput(bias)
        tdy = [env.tput(dy) for _ in range(k)]
        _, mean, rstd = t.ops.aten.native_layer_norm(tx, [d], tw, tb, LN_EPS)

        def torch_fn(g, a, mu, rs, w, b):
            return t.ops.aten.native_layer_norm_backward(g, a, [a.shape[1]], mu, rs, w, b,
                                                         [True, True, True])

        def args(i):
            return (tdy[i % k], tx, mean, rstd, tw, tb)
    # minimal bytes: dy and x read, dx written; gain, dgain, dbias and the
    # per-row mean and 1/std kept by the forward
    return Fused("LayerNorm backward", (3 * n * d + 3 * d + 2 * n) * 4, ours, torch_fn, args,
                 None, lambda: _layernorm64(x, gain, bias, dy))


def _compiled(torch, fn, args):
    """(``torch.compile(fn)``, seconds of its first call, which compiles, None),
    or (None, None, why) where it fails."""
    try:
        cf = torch.compile(fn, dynamic=False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        cf(*args)
        torch.cuda.synchronize()
        return cf, time.perf_counter() - t0, None
    except Exception as e:  # recorded; the row goes on without it
        return None, None, _first_line(e)


def _host(name, a, h):
    """A float64 NumPy copy of an output: ours (a handler array of ``h``) or a tensor."""
    if name == "ours":
        return h.get_numpy_copy(a)
    return a.detach().double().cpu().numpy()


def run_fused(env, item, shape, reps, compile_, checks):
    """Time and check one fused row on ours, PyTorch eager and (with
    ``compile_``) ``torch.compile``; a PyTorch form that fails is recorded
    in the row's ``notes`` and left out.  Returns the row."""
    t = env.torch
    fns = {"ours": (env.timer, item.ours)}
    notes, compile_s = {}, None
    if item.torch_fn is not None:
        fns["torch"] = (env.torch_timer,
                        item.eager or (lambda i: item.torch_fn(*item.args(i))))
        if compile_:
            cf, compile_s, why = _compiled(t, item.torch_fn, item.args(0))
            if cf is None:
                notes["torch.compile"] = why
            else:
                fns["torch.compile"] = (env.torch_timer, lambda i: cf(*item.args(i)))
    outs = {}
    for label in list(fns):      # once each: the outputs checked, and what fails left out
        try:
            outs[label] = [_host("ours" if label == "ours" else "torch", a, env.h32)
                           for a in fns[label][1](0)]
        except Exception as e:  # recorded as the row's note
            if label == "ours":
                raise
            notes[label] = _first_line(e)
            del fns[label]
    ref = item.ref()
    errors = {k: max(rel_error(np.ravel(g), np.ravel(r)) for g, r in zip(v, ref))
              for k, v in outs.items()}
    tol = LAYERNORM_TOL if item.name.startswith("LayerNorm") else SOFTMAX_TOL
    _check(checks, f"{item.name} {shape}", errors, tol)
    ms = interleaved(fns, reps=reps, inner=LOOP)
    frac = {k: item.nbytes / (v["median"] * 1e-3) / env.copy_Bps for k, v in ms.items()}
    for k, why in notes.items():
        print(f"fused: {item.name} {shape}: {k} left out: {why}")
    return dict(op=item.name, shape=list(shape), bytes=int(item.nbytes), ms=ms,
                fraction_of_copy=frac, compile_s=compile_s, notes=notes,
                speed_vs_torch=_ratio(ms.get("torch", {}).get("median"), ms["ours"]["median"]),
                speed_vs_compiled=_ratio(ms.get("torch.compile", {}).get("median"),
                                         ms["ours"]["median"]))


def fused_rows(env, shapes, seed, reps, compile_, checks):
    """The fused rows at each of ``shapes``; prints their table."""
    rng = np.random.default_rng([seed, 2])
    rows = []
    for shape in shapes:
        n, d = shape
        x = rng.standard_normal(shape, dtype=np.float32)
        dy = rng.standard_normal(shape, dtype=np.float32)
        labels = rng.integers(0, d, n)
        gain = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(d)).astype(np.float32)
        for build, inputs in ((_fused_softmax, (x,)), (_fused_cross_entropy, (x, labels)),
                              (_fused_layernorm_forward, (x, gain, bias)),
                              (_fused_layernorm_backward, (x, gain, bias, dy))):
            try:
                rows.append(run_fused(env, build(env, *inputs), shape, reps, compile_, checks))
            except Exception as e:  # recorded, judged as a failed check
                what = f"{build.__name__[7:]} {shape}"
                print(f"check {what}: FAILED ({_first_line(e)})")
                checks.append(dict(what=what, errors={}, tol=None, ok=False,
                                   error=_first_line(e)))
    cells = []
    for r in rows:
        ms, fr = r["ms"], r["fraction_of_copy"]
        cells.append([r["op"], str(tuple(r["shape"])), r["bytes"] / MB]
                     + [_us(ms.get(k)) for k in ("ours", "torch", "torch.compile")]
                     + [_nan(r["compile_s"])]
                     + [_nan(fr.get(k)) for k in ("ours", "torch", "torch.compile")]
                     + [_nan(r["speed_vs_torch"]), _nan(r["speed_vs_compiled"])])
    print(f"\nFused rows, float32; bytes: inputs read once, outputs written once; copy = "
          f"{env.copy_Bps / 1e12:.3f} TB/s; compile s: torch.compile's first call, not timed "
          f"in its row" + ("" if compile_ else " (torch.compile not run)"))
    print_table(["op", "shape", "MB", "ours us", "torch us", "compiled us", "compile s",
                 "ours/copy", "torch/copy", "compiled/copy", "vs torch", "vs compiled"], cells)
    return rows


# ------------------------------------------------------------------ setup and main
def _environment(args, reps):
    """What the sections share: handlers, libraries, timers, sizes and the copy
    bandwidth (measured with ``reps`` samples); None (after saying why) where
    the suite skips."""
    dtype = dtypes.resolve(args.dtype)
    env = SimpleNamespace(dtype=dtype, torch=None, torch_timer=None, tput=None)
    if args.handler == "numpy":
        from handlers import NumpyHandler
        h = NumpyHandler(dtype)
        env.h32 = h.twin(np.float32)
        env.libs = {"ours": Lib(h, h.create_from_numpy, h.get_numpy_copy, HostTimer(h),
                                h.synchronize_all_streams)}
        env.timer, env.device, env.inputs = HostTimer(env.h32), "CPU", lambda nbytes: 2
        env.read_only = None
        env.where = "host clock, NumpyHandler (a smoke test, not a measurement)"
        env.random_bytes, env.fused_shapes = SMOKE_BYTES, SMOKE_FUSED_SHAPES[:1 + (not args.quick)]
        src = np.ones(SMOKE_BYTES[1] // 4, np.float32)
        dst = np.empty_like(src)
        ms = env.timer.measure(lambda i: np.copyto(dst, src), reps=reps, inner=LOOP)
        env.copy_Bps = derive(ms, lambda t: 2 * src.nbytes / (t * 1e-3))["median"]
        return env
    h = cuda_handler("reductions", dtype)
    if h is None:
        print("reductions: '--handler numpy' runs it on NumpyHandler at tiny sizes instead")
        return None
    peers = optional_peers()
    env.libs = libraries(h, peers)
    env.h32 = h.twin(np.float32)
    env.timer, env.device, env.inputs = EventTimer("pycuda", env.h32.stream), gpu_name(), \
        inputs_beyond_l2
    env.random_bytes, env.where = RANDOM_BYTES, "inputs read from DRAM"
    env.fused_shapes = FUSED_SHAPES[:1] if args.quick else FUSED_SHAPES
    env.read_only = lambda nbytes, reps: read_only_ms(env.h32, nbytes, reps)
    if "torch" in peers:
        t = env.torch = peers["torch"]
        tdt = _torch_dtype(t, dtype)
        env.torch_timer = env.libs["torch"].timer
        env.tput = lambda a: t.from_numpy(np.ascontiguousarray(a, np.float32)).cuda()
        # Half formats travel as float32 (exact) and are cast on the device:
        # PyTorch reads no ml_dtypes arrays.
        env.libs["torch"] = env.libs["torch"]._replace(
            put=lambda a: env.tput(a).to(tdt),
            get=lambda a: (a.float() if a.is_floating_point() else a).cpu().numpy())
    if "cupy" in env.libs and dtypes.short_name(dtype) == "bf16":
        del env.libs["cupy"]
        print("reductions: CuPy has no bfloat16: left out")
    env.copy_Bps = copy_spread(h, (128 * MB) // dtype.itemsize, reps)["median"]
    return env


def _parser():
    p = suite_parser("reductions", __doc__)
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the random set (default: drawn from the clock, once per "
                        "process; always printed and saved, so a run can be repeated)")
    p.add_argument("--cases", type=int, default=None,
                   help=f"cases in the random set (default {DEFAULT_CASES}; "
                        f"{QUICK_CASES} with --quick)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                   help="format of the random set and the fixed rows (the fused rows are "
                        "float32)")
    p.add_argument("--quick", action="store_true",
                   help="a handful of cases, fewer repeats, one fused shape, no torch.compile "
                        "(a check in well under a minute)")
    p.add_argument("--reps", type=int, default=None,
                   help="timed samples per figure (default 10; 5 with --quick)")
    p.add_argument("--sections", default="random,fixed,fused",
                   help="comma separated, of random, fixed, fused (default all three)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="time torch.compile in the fused rows (default: on, off with --quick)")
    p.add_argument("--handler", choices=("pycuda", "numpy"), default="pycuda",
                   help="pycuda (default; skips without a GPU) or numpy (tiny sizes, host "
                        "clock, no peers: a smoke test)")
    return p


_SEED = []


def clock_seed():
    """The default seed: drawn from the clock once per process, so that the
    rounds of ``python -m benchmarks --runs N`` measure the same cases (and
    their runs, having the same options, combine)."""
    if not _SEED:
        _SEED.append(time.time_ns() // 1000 % (1 << 31))
    return _SEED[0]


def main(argv=None):
    """Run the suite (options: ``--help``); returns the exit status."""
    args = _parser().parse_args(argv)
    if args.seed is None:
        args.seed = clock_seed()
    if args.cases is None:
        args.cases = QUICK_CASES if args.quick else DEFAULT_CASES
    if args.compile is None:
        args.compile = not args.quick
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = sections - {"random", "fixed", "fused"}
    if unknown:
        print(f"reductions: unknown section(s) {', '.join(sorted(unknown))}; "
              f"choose from random, fixed, fused")
        return 2
    reps = args.reps or (5 if args.quick else 10)
    env = _environment(args, reps)
    if env is None:
        return 0
    run = Run("reductions", env.device, vars(args))
    print(f"reductions: seed {args.seed} (--seed {args.seed} repeats this run's cases); "
          f"{type(env.libs['ours'].mod).__name__} {env.dtype.name}; peers: "
          f"{', '.join(k for k in env.libs if k != 'ours') or 'none'}; {reps} samples per figure")
    checks = []
    results = {"gpu": run.device, "dtype": env.dtype.name, "seed": args.seed,
               "copy_Bps": env.copy_Bps, "checks": checks,
               "targets": {"every": EVERY_TARGET, "median": MEDIAN_TARGET,
                           "copy_above_64MB": COPY_TARGET, "conv": CONV_TARGET}}
    if "random" in sections:
        results["random"] = random_set(env, args.seed, args.cases, reps, checks)
    if "fixed" in sections:
        results["fixed"] = fixed_rows(env, args.seed, reps, checks)
    if "fused" in sections:
        results["fused"] = fused_rows(env, env.fused_shapes, args.seed, reps,
                                      args.compile and env.torch is not None, checks)
    return finish(run, results, checks, args.save)
