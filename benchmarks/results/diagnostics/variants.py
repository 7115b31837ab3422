"""What the diagnostics that time kernel variants share.

``register_caps``, ``summed_rows_prefetch`` and ``summed_rows_variants``: a
process builds its kernels once, so each variant runs in a process of its
own (the script again, ``--run ARG``), times the same cases on a fresh
float32 ``PyCudaHandler`` and prints one ``RESULT`` line of JSON, which the
parent collects (``collect``) and prints (``print_results``).

``summed_rows_variants`` and ``full_rows_variants`` change a row kernel's
generated source as text (``change_source``, ``patch_sources``) and read
its registers (``block_registers``; ``kernel_resources`` for any kernel of
a source, as ``summed_rows_trips`` reads them).

``layer_norm_stats`` and ``layer_norm_backward64``: LayerNorm's kept
statistics and its backward's float64 reference, which the LayerNorm
diagnostics check against; ``layer_norm_backward_case`` sets up a case of
its backward on a handler with them.

``half_rows_held`` and ``held_counts``: each held count on a fresh handler
of one process (``held_handler``), each fused op timed and checked alike
(``time_op``).

``cols_chunk_rounding``, ``cols_wave``, ``short_slabs`` and
``middle_axis_gen``: one reduction timed beside torch under several
planning rules swapped in the process (``torch_reduction_us``,
``ours_reduction``, against ``reduction_reference``; ``REDUCTION_FAMILY``
and ``TORCH_REDUCTION`` name each op's kernel family and torch's
function), and the random sets' plans under such rules (``random_plans``)."""
import contextlib
import json
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile


def time_cases(what, cases, shapes, seed, reps, calls):
    """Print the ``RESULT`` line of ``cases(h, rng, n, c)`` ([(name,
    call(i), check())]) over each (n, c) of ``shapes``: each call's median
    device time (us) over ``reps`` samples of ``calls`` calls, then
    ``check()`` after one more call.  Nothing without a GPU."""
    import numpy as np

    from benchmarks.gpu import EventTimer, cuda_handler
    h = cuda_handler(what, np.float32, what="tool")
    if h is None:
        return
    timer = EventTimer("pycuda", h.stream)
    rows = []
    for n, c in shapes:
        for name, call, check in cases(h, np.random.default_rng(seed), n, c):
            us = timer.measure(call, reps=reps, warmup=2, inner=calls)["median"] * 1e3
            call(0)
            rows.append(dict(op=name, shape=[n, c], us=us, err=check()))
    print("RESULT " + json.dumps(rows))


def collect(script, variants):
    """{variant: its rows} of ``script --run ARG`` for each (variant, ARG)
    of ``variants``, each in a process of its own; a variant that printed
    no result is reported with the end of its output and left out."""
    results = {}
    for variant, arg in variants:
        done = subprocess.run([sys.executable, script, "--run", arg],
                              capture_output=True, text=True)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            print(f"variant {variant}: FAILED\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
            continue
        results[variant] = json.loads(lines[-1][7:])
    return results


def print_results(results, heads):
    """The table of ``collect``'s results: a line per case (op, shape), a
    column per variant headed ``heads[i]`` (its us and check), then each
    variant's median."""
    print(f"{'op':20s} {'shape':14s}" + "".join(f" {h:>16s}" for h in heads))
    first = next(iter(results.values()))
    for i, row in enumerate(first):
        cells = []
        for v in results:
            x = results[v][i]
            cells.append(f" {x['us']:8.2f} ({'ok' if x['err'] < 1e-4 else 'BAD'} "
                         f"{x['err']:.0e})"[:17].rjust(17))
        print(f"{row['op']:20s} {str(tuple(row['shape'])):14s}" + "".join(cells))
    for v, head in zip(results, heads):
        print(f"{head}: median {statistics.median(x['us'] for x in results[v]):.2f} us")


@contextlib.contextmanager
def held_handler(name, fmt, held):
    """A fresh ``PyCudaHandler`` of format ``fmt`` (None without a GPU, after
    saying that the diagnostic ``name`` skipped) whose row kernels hold ``held`` elements a thread
    (``fused_source.held_elements`` forced; None: the tree's), closed and
    the tree's count restored on leaving (kernels are built per handler)."""
    from benchmarks.gpu import cuda_handler
    from handlers import dtypes
    from handlers.cuda import fused_source
    tree = fused_source.held_elements
    if held is not None:
        fused_source.held_elements = lambda op, dtype: held
    h = None
    try:
        h = cuda_handler(name, dtypes.resolve(fmt), what="tool")
        yield h
    finally:
        if h is not None:
            h.close()
        fused_source.held_elements = tree


def time_op(h, timer, op, hosts, out_shapes, refs, scalars, reps, calls):
    """(ms per call, max |error| / max |reference|) of fused op ``op`` on
    ``h``: the host arrays ``hosts`` copied beyond the L2 and cycled, the
    scalars after them, new outputs of ``out_shapes``; the median of
    ``reps`` samples of ``calls`` calls, then one more call checked against
    the float64 ``refs``."""
    import numpy as np

    from benchmarks.ops import inputs_beyond_l2
    copies = inputs_beyond_l2(sum(a.nbytes for a in hosts))
    ins = [[h.create_from_numpy(a) for a in hosts] for _ in range(copies)]
    outs = [h.allocate(s) for s in out_shapes]
    runs = [lambda a=a: op(h, *a, *scalars, *outs) for a in ins]
    ms = timer.measure(lambda i: runs[i % copies](), reps=reps, warmup=2,
                       inner=calls)["median"]
    runs[0]()
    err = max(float(np.abs(h.get_numpy_copy(o).astype(np.float64) - ref).max()
                    / max(1e-30, np.abs(ref).max())) for o, ref in zip(outs, refs))
    return ms, err


# A product that the compiler may contract (the tree's fx::mul rounds it alone).
_MULC = ("namespace sh { namespace fx { __device__ __forceinline__ float mulc(float a, "
         "float b) { return a * b; } } }\n")
#: The changes ``change_source`` makes to a generated row kernel's text.
CHANGES = {
    # products as plain *, which the compiler may contract into multiply-adds
    "fma": lambda t: t.replace('#include "fused.cuh"\n', '#include "fused.cuh"\n' + _MULC,
                               1).replace("fx::mul(", "fx::mulc("),
    # reductions' terms not pinned (fx::keep)
    "nokeep": lambda t: t.replace("s.keep(", "("),
    # every slot folded, the row's own or not: exact only where a block's
    # slots all fall in the row, or where a slot past it gives a zero term
    "unmasked": lambda t: re.sub(r"(rd\d+) = ok \? (fx::\w+\{\}\(\1, k\d+\)) : \1;",
                                 r"\1 = \2;", t),
    # each mean as its sum times 1/cols
    "nodiv": lambda t: re.sub(r"(rd\d+) = \1 / T\(cols\);", r"\1 = \1 * (T(1) / T(cols));", t),
    # no L2 prefetch of the next row (summed outputs)
    "noprefetch": lambda t: "\n".join(ln for ln in t.split("\n")
                                      if "fx::prefetch_l2(" not in ln),
}


def change_source(text, changes):
    """The generated source ``text`` with each of ``changes`` (names in
    ``CHANGES``; others are ignored: a caller's planner changes) made."""
    for c in changes:
        if c in CHANGES:
            text = CHANGES[c](text)
    return text


def patch_sources(ops, changes):
    """From now on in this process, the row kernels of the fused ops ``ops``
    are generated with ``changes`` made (``change_source``)."""
    from handlers.cuda import fused_source
    source = fused_source.row_kernel_source

    def changed(op, dtype, block, formats=None):
        text = source(op, dtype, block, formats)
        return change_source(text, changes) if op in ops else text
    fused_source.row_kernel_source = changed


def block_registers(op, changes):
    """'<registers> regs, <bytes> B spilled' of the float32 block kernel of
    fused op ``op`` generated with ``changes`` (nvcc, sm_90), or '?' without
    nvcc."""
    import numpy as np

    from handlers.cuda import fused_source
    text = change_source(fused_source.row_kernel_source(op, np.float32,
                                                        fused_source.ROW_BLOCK), changes)
    found = kernel_resources(text, fused_source.kernel_name(op, np.float32) + "_block")
    if found is None:
        return "?"
    return f"{found['registers']} regs, {found['spilled']} B spilled"


def kernel_resources(text, name):
    """{'registers', 'stack', 'spilled'} (ptxas's figures, '?' where it gave
    none) of kernel ``name`` in the CUDA source ``text`` of a row kernel
    (nvcc, sm_90), or None without nvcc or without that kernel.  A stack
    frame without spills is an array indexed at run time: in local memory."""
    from handlers.cuda import fused_source
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    kernels = pathlib.Path(fused_source.__file__).parent / "kernels"
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "k.cu"
        src.write_text(text)
        done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-cubin", "-I", str(kernels),
                               "-Xptxas", "-v", "-o", str(src.with_suffix(".cubin")), str(src)],
                              capture_output=True, text=True)
    out = done.stderr.split(f"Compiling entry function '{name}'", 1)
    if len(out) < 2:
        return None
    found = {}
    for key, pattern in (("registers", r"Used (\d+) registers"),
                         ("stack", r"(\d+) bytes stack frame"),
                         ("spilled", r"(\d+) bytes spill stores")):
        m = re.search(pattern, out[1])
        found[key] = m.group(1) if m else "?"
    return found


def layer_norm_stats(x, eps):
    """(mean, 1/std) of each row of float32 ``x``, computed in float64 and
    kept in float32, as LayerNorm's forward keeps them for its backward."""
    import numpy as np
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    r = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + eps)
    return mu.astype(np.float32), r.astype(np.float32)


def layer_norm_backward64(dy, x, gain, mu, r):
    """[dx, dgain, dbias] of LayerNorm's backward in float64, from its
    inputs as they are (mu and r the per-row statistics it was given)."""
    import numpy as np
    dy, x, gain, mu, r = (np.asarray(a, np.float64) for a in (dy, x, gain, mu, r))
    xhat = (x - mu) * r
    g = dy * gain
    dx = r * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return [dx, (dy * xhat).sum(axis=0, keepdims=True), dy.sum(axis=0, keepdims=True)]


def layer_norm_backward_case(h, dy, x, gain, eps):
    """LayerNorm's backward on ``h`` over float32 host ``dy``, ``x`` and
    ``gain``: ``SimpleNamespace(k, dys, args, outs, want, check)``, ``dys``
    ``k`` device copies of dy (inputs from DRAM when cycled), ``args`` the
    op's other inputs (x, gain, mean, 1/std) on ``h``, ``outs`` (dx, dgain,
    dbias), ``want`` their float64 reference and ``check()`` the largest
    max |error| / max |reference| of the outputs as they stand."""
    import types

    import numpy as np

    from benchmarks.ops import inputs_beyond_l2
    n, c = dy.shape
    mu, r = layer_norm_stats(x, eps)
    want = layer_norm_backward64(dy, x, gain, mu, r)
    k = inputs_beyond_l2(dy.nbytes)
    outs = [h.allocate((n, c)), h.allocate((1, c)), h.allocate((1, c))]

    def check():
        return max(float(np.max(np.abs(h.get_numpy_copy(o).astype(np.float64) - w))
                         / np.max(np.abs(w))) for o, w in zip(outs, want))
    return types.SimpleNamespace(
        k=k, dys=[h.create_from_numpy(dy) for _ in range(k)],
        args=[h.create_from_numpy(a) for a in (x, gain, mu, r)], outs=outs, want=want,
        check=check)


#: each reduction op's kernel family (``reductions.plan``'s) and torch's
#: function for it
REDUCTION_FAMILY = {"sum_t": "sum", "mean_t": "sum", "max_t": "max", "min_t": "min",
                    "argmax_t": "pick"}
TORCH_REDUCTION = {"sum_t": "sum", "mean_t": "mean", "max_t": "amax", "min_t": "amin",
                   "argmax_t": "argmax"}


def random_plans(seeds, rules, sms=132, sm_threads=2048, per_sm=4):
    """Each case of the reductions suite's random sets (``draw_cases`` of
    ``seeds``, 48 a seed) as (op, shape, axis, axes, [its plan under each
    of ``rules``]), ``rules`` swapped in as ``reductions._chunking`` in
    turn (the library's restored after), on a device of ``sms``
    multiprocessors of ``sm_threads`` threads whose kernels hold
    ``per_sm`` blocks each.  No GPU."""
    from benchmarks.reductions import RANDOM_BYTES, draw_cases
    from handlers.cuda import reductions as R
    library = R._chunking
    try:
        for seed in seeds:
            for c in draw_cases(seed, 48, RANDOM_BYTES):
                shape = tuple(c["shape"])
                axis = tuple(c["axis"]) if isinstance(c["axis"], list) else c["axis"]
                axes = R._axes(len(shape), axis)
                plans = []
                for rule in rules:
                    R._chunking = rule
                    plans.append(R.plan(shape, axes, True, 4, REDUCTION_FAMILY[c["op"]], sms,
                                        sm_threads, blocks_per_sm=lambda kernel, block: per_sm))
                yield c["op"], shape, axis, axes, plans
    finally:
        R._chunking = library


def reduction_reference(op, host, axis):
    """NumPy's result of reduction ``op`` of float32 ``host`` over ``axis``:
    float64 sums and means, the extremes and argmax exact."""
    import numpy as np
    if op == "argmax_t":
        return np.argmax(host, axis=axis)
    return {"sum_t": np.sum, "mean_t": np.mean, "max_t": np.max, "min_t": np.min}[op](
        host.astype(np.float64), axis=axis)


def torch_reduction_us(torch, op, host, axis, ref, copies, reps, calls):
    """torch's us per call of ``op`` over ``axis`` of ``host``, cycling
    ``copies`` copies on the GPU (inputs from DRAM): the median of ``reps``
    samples of ``calls`` calls; NaN without torch."""
    if torch is None:
        return float("nan")
    from benchmarks.gpu import EventTimer
    ts = [torch.from_numpy(host).cuda() for _ in range(copies)]
    fn = getattr(torch, TORCH_REDUCTION[op])
    o = torch.empty(ref.shape, device="cuda",
                    dtype=torch.int64 if op == "argmax_t" else torch.float32)
    timer = EventTimer("torch", module=torch)
    return statistics.median(timer.sample(lambda i: fn(ts[i % copies], dim=axis, out=o), 0, calls)
                             for _ in range(reps)) * 1e3


def ours_reduction(op, host, axis, ref, copies, reps, calls):
    """(us per call, max |error| / max |reference|, plan) of ``op`` over
    ``axis`` of float32 ``host`` on a fresh ``PyCudaHandler`` (plans are
    cached per handler: a rule swapped in since an earlier handler takes
    effect), timed as :func:`torch_reduction_us`, checked after one call."""
    import numpy as np

    from benchmarks.gpu import EventTimer
    from handlers.cuda import reductions as R
    from handlers.cuda.handler import PyCudaHandler
    h = PyCudaHandler(np.float32)
    try:
        xs = [h.create_from_numpy(host) for _ in range(copies)]
        out = h.allocate(ref.shape if ref.ndim else (1,))
        red = getattr(h, op)
        red(xs[0], axis, out)
        got = h.get_numpy_copy(out).astype(np.float64).reshape(ref.shape)
        err = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
        plan = R.plan(host.shape, R._axes(host.ndim, axis), True, 4, REDUCTION_FAMILY[op],
                      h._sms, h._sm_threads, blocks_per_sm=h._blocks_per_sm("TT"))
        timer = EventTimer("pycuda", h.stream)
        us = statistics.median(timer.sample(lambda i: red(xs[i % copies], axis, out), 0, calls)
                               for _ in range(reps)) * 1e3
    finally:
        h.close()
    return us, err, plan


def swapper(module, name):
    """``use(rule)`` for :func:`compare_rules`: the function that, called,
    sets ``module.name`` to ``rule`` (a planner rule swapped in the process)."""
    def use(rule):
        return lambda: setattr(module, name, rule)
    return use


def compare_rules(title, cases, rules, restore, reps, calls):
    """Print ``title`` (after the device copy's bandwidth), then a row per
    (op, shape, axis) of ``cases``: torch's us per call, ours under each
    rule of ``rules`` ({name: apply()}, applied before that rule's run;
    ``restore()`` after each case) with its plan's kernel and grid,
    torch's time over each rule's, and each rule's check
    (:func:`ours_reduction`); every input read from DRAM."""
    import numpy as np

    from benchmarks.gpu import optional_peers
    from benchmarks.ops import copy_bandwidth, inputs_beyond_l2
    from handlers.cuda.handler import PyCudaHandler
    torch = optional_peers().get("torch")
    rng = np.random.default_rng(0)
    h0 = PyCudaHandler(np.float32)
    copy = copy_bandwidth(h0, (128 << 20) // 4)
    h0.close()
    print(f"{title}; copy {copy / 1e12:.3f} TB/s; us per call, median of {reps} samples of "
          f"{calls} calls, inputs from DRAM; each plan's kernel and grid; t/x: torch's time "
          f"over x's")
    print(f"{'op':9s} {'shape':20s} {'axis':7s} {'MB':>7s} {'torch':>7s} "
          + " ".join(f"{name:>29s}" for name in rules)
          + " ".join(f"{'t/' + name:>8s}" for name in rules) + "  check")
    for op, shape, axis in cases:
        host = rng.standard_normal(shape).astype(np.float32)
        k = inputs_beyond_l2(host.nbytes)
        ref = reduction_reference(op, host, axis)
        t_us = torch_reduction_us(torch, op, host, axis, ref, k, reps, calls)
        cells, ratios, checks = [], [], []
        for apply in rules.values():
            apply()
            us, err, plan = ours_reduction(op, host, axis, ref, k, reps, calls)
            name = plan.launch.kernel if plan else "-"
            cells.append(f"{us:8.2f} {name:>14s} {plan.launch.grid if plan else 0:5d}")
            ratios.append(f"{t_us / us:8.3f}")
            checks.append(f"{err:.0e}")
        restore()
        print(f"{op:9s} {str(shape):20s} {str(axis):7s} {host.nbytes / 1e6:7.2f} {t_us:7.2f} "
              + " ".join(f"{c:>29s}" for c in cells) + " ".join(ratios)
              + "  " + " ".join(checks))
