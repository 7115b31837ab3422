"""Can cuBLASLt GEMMs with fused epilogues make our captured MLP training step (784-1024-1024-10,
batch 256, float32, TF32 off, ReLU, SGD) faster than torch.compile's?  On an H200 ours takes
0.180 ms captured, its 8 products alone 0.173 ms; torch.compile's graphed step 0.168 ms.

Each figure is device time per call: 20 back-to-back calls captured once in a CUDA graph, the
median of 15 replays between CUDA events, the figures of one comparison interleaved.
1. The step's 8 products: ours (``dot_mm``), ``torch.mm``, cuBLASLt's heuristic's first
   algorithm and the fastest of the up to 32 it offers (each timed alone first); sums.
2. Each hidden layer's forward relu(x @ W + b): ours (``dot_mm``, fused bias+ReLU op),
   cuBLASLt RELU_AUX_BIAS (writes y and the ReLU bit mask), torch (``addmm``, ``relu_``).
3. Layer 2's backward from d3: ours (d3 W3^T, fused derivative+bias-gradient op, dW2 and dh1
   products); cuBLASLt with DRELU_BGRAD on d3 W3^T (reads the mask, writes db2), or DRELU
   there and BGRADA on the dW2 product; torch.
cuBLASLt results are checked against float64 NumPy (max |error| / max |reference| <= 1e-4);
a figure that fails is printed FAILED, not timed.  Run by hand from the project root on a GPU
machine with nvmath-python (torch optional):
``python benchmarks/results/diagnostics/mlp_gemm_epilogues.py``.  Its run:
``mlp_gemm_epilogues-NVIDIA-H200.log`` (2026-11-27).
"""
import pathlib
import sys
import traceback

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
import lt_matmul  # noqa: E402  (this folder's, beside the script)

from benchmarks.gpu import EventTimer, optional_peers, torch_graphed  # noqa: E402
from handlers.cuda.handler import PyCudaHandler  # noqa: E402
from layers.epilogues import OPS  # noqa: E402

B, N, REPEAT, REPS, TOL, WANT = 256, 1024, 20, 15, 1e-4, 32
MASK_LD = 1024      # the ReLU bit mask's leading dimension in bits: >= N, a multiple of 128

h = PyCudaHandler(np.float32)
S = lt_matmul.Session(h, REPEAT, TOL, WANT)
torch = optional_peers().get("torch")
TORCH_TIMER = EventTimer("torch", module=torch) if torch else None
rng = np.random.default_rng(0)


def draw(*shape, scale=1.0):
    """Seeded standard normal float32 values times ``scale``."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def dev(a, lib="ours"):
    """A device copy of the host array ``a``: ours, or torch's."""
    a = np.ascontiguousarray(a, np.float32)
    return torch.from_numpy(a).cuda() if lib == "torch" else h.create_from_numpy(a)


def Lt(a, b, c, transa=False, transb=False, **kw):
    """A float32 product with its epilogue on this script's session
    (``lt_matmul.Lt``), the ReLU mask MASK_LD bits a row of C."""
    return lt_matmul.Lt(S, a, b, c, transa, transb, aux_ld=MASK_LD, **kw)


def graphed(kind, issue):
    """(timer, fn(i)) for ``interleaved``: fn replays REPEAT calls of ``issue()`` captured
    once in a graph, torch's for ``kind`` "torch", else ours (cuBLASLt runs on our stream)."""
    if kind != "torch":
        return S.graphed(issue)

    def step(i):
        for _ in range(REPEAT):
            issue()
    return TORCH_TIMER, torch_graphed(torch, step)


def lt_figure(cases, label, gemms, which, checks):
    """Add the chain ``gemms``, each at its heuristic's first algorithm (``which`` "first")
    or its fastest ("best"), to ``cases`` if its outputs pass ``checks``; else print FAILED."""
    picks = [0 if which == "first" else g.best for g in gemms]
    if any(not g.algos for g in gemms) or None in picks:
        print(f"   {label}: FAILED (no algorithm offered, or none passed)")
        return
    for g, p in zip(gemms, picks):
        g.pick = p

    def run():
        for g in gemms:
            g()
    err = S.max_err(run, checks)
    print(f"   {label}: {'FAILED, ' if err > TOL else ''}max rel err {err:.1e}")
    if err <= TOL:
        cases[label] = graphed("lt", run)


def report(cases):
    """Time ``cases`` interleaved; print each in us per call, and its difference from ours."""
    us = S.timed(cases, REPS)
    for k, v in us.items():
        diff = f"  ({v - us['ours']:+.1f} against ours)" if k != "ours" else ""
        print(f"   {k:40s} {v:7.1f} us{diff}", flush=True)


X, D1, D2, D3 = draw(B, 784), draw(B, N), draw(B, N), draw(B, 10)
W1, W2, W3 = draw(784, N, scale=784**-0.5), draw(N, N, scale=N**-0.5), draw(N, 10, scale=N**-0.5)
B1, B2 = draw(1, N, scale=0.1), draw(1, N, scale=0.1)
H1, H2 = np.maximum(draw(B, N), 0), np.maximum(draw(B, N), 0)
PRODUCTS = [("x W1", X, W1, False, False), ("h1 W2", H1, W2, False, False),
            ("h2 W3", H2, W3, False, False), ("x^T d1", X, D1, True, False),
            ("h1^T d2", H1, D2, True, False), ("h2^T d3", H2, D3, True, False),
            ("d2 W2^T", D2, W2, False, True), ("d3 W3^T", D3, W3, False, True)]


def product_row(ha, hb, ta, tb):
    """One product's figures, {label: us}, and its Lt."""
    want = (ha.T if ta else ha).astype(np.float64) @ (hb.T if tb else hb).astype(np.float64)
    a, b = dev(ha), dev(hb)
    c_ours, c_lt = h.allocate(want.shape), h.allocate(want.shape)
    cases = {"ours": graphed("ours", lambda: h.dot_mm(a, b, c_ours, transa=ta, transb=tb))}
    if torch:
        oa, ob, oc = dev(ha, "torch"), dev(hb, "torch"), torch.empty(want.shape, device="cuda")
        oa, ob = oa.t() if ta else oa, ob.t() if tb else ob
        cases["torch"] = graphed("torch", lambda: torch.mm(oa, ob, out=oc))
    g = Lt(a, b, c_lt, ta, tb)
    g.search([(c_lt, want)])
    for which in ("first", "best"):
        lt_figure(cases, which, [g], which, [(c_lt, want)])
    return S.timed(cases, REPS), g


def section_products():
    """1: the step's 8 products alone: a table and its sums."""
    print("1. products, us per call (Lt first: the heuristic's #0; Lt best: the fastest)")
    cols, sums, rows = ("ours", "torch", "first", "best"), {}, []
    for name, ha, hb, ta, tb in PRODUCTS:
        try:
            us, g = product_row(ha, hb, ta, tb)
        except Exception:
            print(f"   {name}: error")
            traceback.print_exc()
            continue
        for k in us:
            sums.setdefault(k, []).append(us[k])
        rows.append(f"   {name:10s}" + "".join(
            f"{us[k]:9.1f}" if k in us else f"{'-' if k == 'torch' else 'FAILED':>9s}"
            for k in cols) + f"   #{g.best}")
    print(f"   {'product':10s}{'ours':>9s}{'torch':>9s}{'Lt first':>9s}{'Lt best':>9s}   algo")
    print("\n".join(rows))
    print(f"   {'sum':10s}" + "".join(f"{sum(sums[k]):9.1f}" if k in sums else f"{'-':>9s}"
                                     for k in cols)
          + "".join(f"  ({k}: {len(v)} of 8)" for k, v in sums.items() if len(v) < 8), flush=True)


def forward_layer(name, hx, hw, hb):
    """2: one hidden layer's forward, y = relu(x @ W + b)."""
    print(f"2. {name} forward, relu(x @ W + b), x {hx.shape}, W {hw.shape}")
    M = hx.shape[0]
    want = np.maximum(hx.astype(np.float64) @ hw.astype(np.float64) + hb, 0)
    xd, wd, bd = dev(hx), dev(hw), dev(hb)
    y_ours, y_lt, mask = h.allocate((M, N)), h.allocate((M, N)), h.allocate((MASK_LD * M // 32,))
    epilogue = OPS["relu"][0].bind(h, y_ours, bd, y_ours)   # (z, b, y), in place as the layer

    def ours():
        h.dot_mm(xd, wd, y_ours)
        epilogue()
    cases = {"ours": graphed("ours", ours)}
    if torch:
        tx, tw, tb = dev(hx, "torch"), dev(hw, "torch"), dev(hb[0], "torch")
        ty = torch.empty((M, N), device="cuda")

        def theirs():
            torch.addmm(tb, tx, tw, out=ty)
            torch.relu_(ty)
        cases["torch"] = graphed("torch", theirs)
    g = Lt(xd, wd, y_lt, epilogue="RELU_AUX_BIAS", bias=bd, aux=mask)
    g.search([(y_lt, want)])
    for which in ("first", "best"):
        lt_figure(cases, f"cuBLASLt RELU_AUX_BIAS, {which}", [g], which, [(y_lt, want)])
    report(cases)


def backward_layer():
    """3: layer 2's backward from d3: g2 = (d3 W3^T) * (h2 > 0), db2 = g2 summed over the
    batch, dW2 = h1^T g2, dh1 = g2 W2^T."""
    print("3. layer 2 backward from d3: d3 W3^T, ReLU derivative and db2, dW2, dh1")
    h1d, w2d, b2d, w3d, d3d = dev(H1), dev(W2), dev(B2), dev(W3), dev(D3)
    h2d, mask = h.allocate((B, N)), h.allocate((MASK_LD * B // 32,))
    forward = Lt(h1d, w2d, h2d, epilogue="RELU_AUX_BIAS", bias=b2d, aux=mask)
    err = S.max_err(forward, [(h2d, np.maximum(H1.astype(np.float64) @ W2 + B2, 0))])
    print(f"   forward giving h2 and its mask (heuristic #0): max rel err {err:.1e}")
    if err > TOL:
        raise RuntimeError("the forward that writes the mask failed its check")
    # The references mask with the device's h2: a sign that float64 would flip still agrees.
    h2 = h.get_numpy_copy(h2d).astype(np.float64)
    g_ref = (D3.astype(np.float64) @ W3.T) * (h2 > 0)
    db_ref, dw_ref, dh1_ref = g_ref.sum(0), H1.T.astype(np.float64) @ g_ref, g_ref @ W2.T
    dh2o, g2o, dw2o, dh1o, db2o = (h.allocate(s) for s in ((B, N),) * 2 + ((N, N), (B, N), (1, N)))
    derivative = OPS["relu"][1].bind(h, dh2o, h2d, g2o, db2o)   # (dy, y, g, db)

    def ours():
        h.dot_mm(d3d, w3d, dh2o, transb=True)
        derivative()
        h.dot_mm(h1d, g2o, dw2o, transa=True)
        h.dot_mm(g2o, w2d, dh1o, transb=True)
    cases = {"ours": graphed("ours", ours)}
    if torch:
        td3, tw3, th1, tw2, th2 = (dev(a, "torch") for a in (D3, W3, H1, W2, h2))
        tdh2, tg, tdh1, tdw, tdb = (torch.empty(s, device="cuda")
                                    for s in ((B, N),) * 3 + ((N, N), (N,)))

        def theirs():
            torch.mm(td3, tw3.t(), out=tdh2)
            torch.mul(tdh2, th2 > 0, out=tg)
            torch.sum(tg, 0, out=tdb)
            torch.mm(th1.t(), tg, out=tdw)
            torch.mm(tg, tw2.t(), out=tdh1)
        cases["torch"] = graphed("torch", theirs)
    # Row-major, both reductions run over the batch: DRELU_BGRAD's over g2's rows (the
    # column-major D's columns), BGRADA's over K of dW2 = h1^T g2, whose B operand is g2.
    for first, dw_epilogue in (("DRELU_BGRAD", "DEFAULT"), ("DRELU", "BGRADA")):
        try:
            g2, dw2, dh1, db2 = (h.allocate(s) for s in ((B, N), (N, N), (B, N), (1, N)))
            on_first = first == "DRELU_BGRAD"
            gemms = [Lt(d3d, w3d, g2, transb=True, epilogue=first, aux=mask,
                        bias=db2 if on_first else None),
                     Lt(h1d, g2, dw2, transa=True, epilogue=dw_epilogue,
                        bias=None if on_first else db2),
                     Lt(g2, w2d, dh1, transb=True)]
            per = [[(g2, g_ref)] + ([(db2, db_ref)] if on_first else []),
                   [(dw2, dw_ref)] + ([] if on_first else [(db2, db_ref)]), [(dh1, dh1_ref)]]
            for g, checks in zip(gemms, per):
                g.search(checks)
            for which in ("first", "best"):
                lt_figure(cases, f"cuBLASLt {first}, dW2 {dw_epilogue}, {which}", gemms,
                          which, [c for cs in per for c in cs])
        except Exception:
            print(f"   cuBLASLt {first}, dW2 {dw_epilogue}: error")
            traceback.print_exc()
    report(cases)


print(f"float32, TF32 off, batch {B}; torch {torch.__version__ if torch else 'absent'}; "
      f"{REPEAT} calls a graph, median of {REPS} replays", flush=True)
lt_matmul.run_sections((section_products, lambda: forward_layer("layer 1", X, W1, B1),
                        lambda: forward_layer("layer 2", H1, W2, B2), backward_layer))
