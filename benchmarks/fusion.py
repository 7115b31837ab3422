"""``python -m benchmarks fusion``: a user-declared fused op against the chain of ops it replaces.

The op: GELU (tanh form) and its derivative in one declaration (inputs x, dy;
outputs y = gelu(x), dx = dy * gelu'(x)), declared with
:func:`handlers.fused_op`.  Measured in one process on one GPU, in interleaved
order, ``LOOP`` calls back to back between two CUDA events, median of the
repeats, on 2^25 float32 elements:

* ours fused (one generated kernel), ours as the chain of contract ops a layer
  writer would otherwise issue (18 launches, three temporaries), and
  PyTorch's ``gelu(approximate="tanh")`` plus ``aten.gelu_backward``;
* bandwidth counts the minimal bytes (x and dy read, y and dx written) against
  the device copy bandwidth; target: the fused op >= 85% of copy;
* beside them, the same generated kernel shape with no math (``y = x + dy``,
  ``dx = x - dy``): what the kernel's memory traffic alone costs, so that the
  gap between it and GELU is the math's.

Checked: each result against float64 NumPy.
"""

import numpy as np

from benchmarks.common import (
    Run,
    check_line,
    derive,
    gpu_name,
    print_table,
    rel_error,
    suite_parser,
)
from benchmarks.gpu import EventTimer, cuda_handler, interleaved, optional_peers
from benchmarks.ops import LOOP, copy_spread

F32 = np.float32
TARGET = 0.85
C0, C1 = 0.7978845608028654, 0.044715     # sqrt(2/pi), the cubic's coefficient

BODY = """
u = 0.7978845608028654 * (x + 0.044715 * x ** 3)
t = tanh(u)
y = 0.5 * x * (1 + t)
dx = dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 0.134145 * x * x))
"""


def gelu_op():
    """The fused declaration (made on first use: importing handlers is cheap)."""
    from handlers import fused_op
    return fused_op("gelu_and_grad", inputs="x dy", outputs="y dx", body=BODY)


def no_math_op():
    """Two inputs, two outputs, an add and a subtract: the memory bound."""
    from handlers import fused_op
    return fused_op("add_and_sub", inputs="x dy", outputs="y dx", body="y = x + dy\ndx = x - dy")


def reference(x, dy):
    """y, dx in float64 NumPy."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    t = np.tanh(C0 * (x + C1 * x ** 3))
    y = 0.5 * x * (1 + t)
    dx = dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C0 * (1 + 3 * C1 * x * x))
    return y, dx


def chain(h, x, dy, y, dx, t1, t2, t3):
    """The same with contract ops, as a layer writer would issue them."""
    h.mult_tt(x, x, t1)                 # x^2
    h.mult_st(C1, t1, t2)               # c1 x^2
    h.add_st(1.0, t2, t2)               # 1 + c1 x^2
    h.mult_tt(x, t2, t2)                # x + c1 x^3
    h.mult_st(C0, t2, t2)               # u
    h.tanh(t2, t2)                      # t
    h.add_st(1.0, t2, t3)               # 1 + t
    h.mult_tt(x, t3, y)
    h.mult_st(0.5, y, y)                # y = 0.5 x (1 + t)
    h.tanh_deriv(t2, t2, dy, t2)        # dy (1 - t^2)
    h.mult_st(3 * C1, t1, t1)           # 3 c1 x^2
    h.add_st(1.0, t1, t1)
    h.mult_tt(t1, t2, t1)               # dy (1 - t^2)(1 + 3 c1 x^2)
    h.mult_tt(x, t1, t1)
    h.mult_st(0.5 * C0, t1, t1)         # 0.5 x dy (1 - t^2) c0 (1 + 3 c1 x^2)
    h.mult_tt(dy, t3, dx)
    h.mult_st(0.5, dx, dx)              # 0.5 dy (1 + t)
    h.add_tt(dx, t1, dx)


def main(argv=None):
    """Run the suite (options: ``--help``); returns the exit status."""
    parser = suite_parser("fusion", __doc__)
    parser.add_argument("--quick", action="store_true", help="2^22 elements, few repeats")
    args = parser.parse_args(argv)
    h = cuda_handler("fusion", F32)
    if h is None:
        return 0
    run = Run("fusion", gpu_name(), vars(args))
    torch = optional_peers().get("torch")
    n = (1 << 22) if args.quick else (1 << 25)
    reps = 5 if args.quick else 15
    rng = np.random.default_rng(7)
    hosts = [(rng.standard_normal(n).astype(F32), rng.standard_normal(n).astype(F32))
             for _ in range(2)]
    dev = [tuple(h.create_from_numpy(a) for a in pair) for pair in hosts]
    outs = {k: (h.allocate((n,)), h.allocate((n,))) for k in ("fused", "chain", "no math")}
    tmp = [h.allocate((n,)) for _ in range(3)]
    op, plain = gelu_op(), no_math_op()
    ours = EventTimer("pycuda", h.stream)
    fns = {"ours fused": (ours, lambda i: op(h, *dev[i % 2], *outs["fused"])),
           "ours chain": (ours, lambda i: chain(h, *dev[i % 2], *outs["chain"], *tmp)),
           "ours fused, no math": (ours, lambda i: plain(h, *dev[i % 2], *outs["no math"]))}
    if torch is not None:
        tdev = [tuple(torch.from_numpy(a).cuda() for a in pair) for pair in hosts]
        gelu_bwd = torch.ops.aten.gelu_backward
        tout = {}

        def theirs(i):
            x, dy = tdev[i % 2]
            tout["y"] = torch.nn.functional.gelu(x, approximate="tanh")
            tout["dx"] = gelu_bwd(dy, x, approximate="tanh")
        fns["torch"] = (EventTimer("torch", module=torch), theirs)
    for _, fn in fns.values():       # once each, for the checks
        fn(0)
    h.synchronize()
    ref = reference(*hosts[0])
    checks, errors = [], {}
    for k in ("fused", "chain"):
        got = [h.get_numpy_copy(a) for a in outs[k]]
        errors[f"ours {k}"] = max(rel_error(g, r) for g, r in zip(got, ref))
    if torch is not None:
        errors["torch"] = max(rel_error(tout[k].double().cpu().numpy(), r)
                              for k, r in zip(("y", "dx"), ref))
    what = f"GELU and its gradient on {n} elements"
    checks.append({"what": what, "errors": errors, "tol": 1e-5,
                   "ok": check_line(what, errors, 1e-5)})
    x64, dy64 = (a.astype(np.float64) for a in hosts[0])
    got = [h.get_numpy_copy(a) for a in outs["no math"]]
    what = f"no-math fused op (x + dy, x - dy) on {n} elements"
    err = {"ours fused, no math": max(rel_error(g, r) for g, r in zip(got, (x64 + dy64,
                                                                           x64 - dy64)))}
    checks.append({"what": what, "errors": err, "tol": 1e-5, "ok": check_line(what, err, 1e-5)})
    copy_bw = copy_spread(h, n, reps)["median"]
    ms = interleaved(fns, reps=reps, inner=LOOP)
    nbytes = 4 * 4 * n
    bps = {k: derive(v, lambda t: nbytes / (t * 1e-3)) for k, v in ms.items()}
    rows = [[k, ms[k]["median"] * 1e3, bps[k]["median"] / 1e12, bps[k]["median"] / copy_bw]
            for k in fns]
    frac = bps["ours fused"]["median"] / copy_bw
    print(f"\nGELU and its gradient, {n} float32 elements (x, dy read; y, dx written); copy = "
          f"{copy_bw / 1e12:.3f} TB/s; target: fused >= {TARGET:.0%} of copy")
    print_table(["version", "us per call", "TB/s", "of copy"], rows)
    print(f"fused: {frac:.1%} of copy ({'holds' if frac >= TARGET else 'MISSES'}); "
          f"{ms['ours chain']['median'] / ms['ours fused']['median']:.2f}x faster than the chain")
    results = {"gpu": run.device, "n": n, "copy_Bps": copy_bw, "ms": ms,
               "fraction_of_copy": {k: bps[k]["median"] / copy_bw for k in fns},
               "checks": checks}
    if args.save:
        run.save(results)
    return 0
