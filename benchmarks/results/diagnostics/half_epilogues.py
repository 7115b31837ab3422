"""What would cuBLASLt's epilogues save the half-format steps, at their own
sizes?  ``lt_epilogues`` and ``mlp_gemm_epilogues`` (2026-11-27) measured
them on the float32 MLP (batch 256, width 1024): there the backward
epilogue cost more over its product (6.7 us) than our fused op after it,
so a layer's backward stays a fused op (``layers.epilogues``) and two
products.  The bfloat16 steps are far larger: in the mixed bfloat16 MLP
(width 4096, batch 4096) the bias-and-ReLU backward took 81 us a call
beside products of 167-174 us, and in the GPT (rows 8192, width 512, 2048
inside the MLP) the bias-and-GELU forward 43 us after a 31 us product and
its backward 70 us after a 31 us product (``step_breakdown-NVIDIA-H200``,
``step_breakdown_gpt-NVIDIA-H200``).

Each figure is device time per call: REPEAT back-to-back calls captured in a
CUDA graph, the median of REPS replays between CUDA events, the figures of
one comparison interleaved; bfloat16 in and out, float32 accumulation.

1. ReLU backward at the MLP's size: the next layer's gradient times its
   weights transposed, then ReLU's derivative and the bias gradient.  Ours
   (``dot_mm`` then the layer's fused op, ``bias_relu_backward``, which
   reads y) against cuBLASLt's DRELU_BGRAD on that product (reading the
   ReLU mask that a RELU_AUX_BIAS forward wrote), and the product alone.
   Also the forward: ours (``dot_bias_act``, one RELU_BIAS call) against
   RELU_AUX_BIAS (which also writes the mask the backward needs).
2. GELU forward at the GPT's first MLP product: ours (``dot_mm`` then the
   fused bias-and-GELU op, y and its input kept, in "gelu" with erf, as
   the GPT runs, and "gelu_tanh") against GELU_AUX_BIAS (tanh form; y and
   the input kept), and the product alone.
3. GELU backward there: the second product's input gradient, then the
   derivative and the bias gradient.  Ours (``dot_mm`` then the fused op)
   against DGELU_BGRAD (tanh form, reading the forward's kept input), and
   the product alone.

cuBLASLt's results are checked against float64 NumPy on the same rounded
inputs (max |error| / max |reference| <= TOL; the masks and kept inputs
are the device's own, so a sign that float64 would flip still agrees); a
figure that fails prints FAILED and is not timed; each algorithm is the
fastest of the heuristic's first WANT that pass.  Run by hand from the
project root on a GPU machine with nvmath-python:
``python benchmarks/results/diagnostics/half_epilogues.py [--quick]``
(``--quick``: the heuristic's first algorithm only).
"""
import math
import pathlib
import sys

import numpy as np

# Run as a script, this file's directory is on sys.path, not the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
import lt_matmul  # noqa: E402  (this folder's, beside the script)

from handlers.cuda.handler import PyCudaHandler  # noqa: E402
from layers.epilogues import OPS  # noqa: E402

REPEAT, REPS, TOL, WANT = 10, 15, 2e-2, 16
QUICK = "--quick" in sys.argv[1:]

h32 = PyCudaHandler(np.float32)   # kept: the bfloat16 twin lives as long as it does
h = h32.twin("bfloat16")
S = lt_matmul.Session(h, REPEAT, TOL, 1 if QUICK else WANT)
rng = np.random.default_rng(0)


def dev(shape, scale=1.0):
    """(device bfloat16 array, its values as float64) of seeded normal values."""
    a = h.create_from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))
    return a, host(a)


def host(a):
    """A device array's values as float64."""
    return h.get_numpy_copy(a).astype(np.float64)


def erf(x):
    """erf of float64 ``x`` within 1.5e-7 (Abramowitz and Stegun 7.1.26),
    vectorized: the references need 16.8 million of them."""
    t = 1 / (1 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                           + t * 1.061405429))))
    return np.sign(x) * (1 - poly * np.exp(-x * x))


def gelu(s, tanh):
    """GELU of float64 ``s``: the tanh form (cuBLASLt's) or erf's."""
    if tanh:
        return 0.5 * s * (1 + np.tanh(0.7978845608028654 * (s + 0.044715 * s ** 3)))
    return 0.5 * s * (1 + erf(s / math.sqrt(2)))


def gelu_deriv(s, tanh):
    """d GELU / d s of float64 ``s``: the tanh form or erf's."""
    if not tanh:
        return 0.5 * (1 + erf(s / math.sqrt(2))) + s * np.exp(-0.5 * s * s) / math.sqrt(2 * math.pi)
    c = 0.7978845608028654
    t = np.tanh(c * (s + 0.044715 * s ** 3))
    return 0.5 * (1 + t) + 0.5 * s * (1 - t * t) * c * (1 + 3 * 0.044715 * s * s)


def Lt(*args, **kw):
    """A bfloat16 product with its epilogue on this script's session
    (``lt_matmul.Lt``)."""
    return lt_matmul.Lt(S, *args, **kw)


def add(cases, label, issue, checks):
    """Time ``issue`` as ``label`` if its results pass ``checks``; else
    print FAILED."""
    err = S.max_err(issue, checks)
    print(f"   {label}: {'FAILED, ' if err > TOL else ''}max rel err {err:.1e}", flush=True)
    if err <= TOL:
        cases[label] = S.graphed(issue)


def report(cases):
    """Time ``cases`` interleaved; print each in us per call, and its
    difference from the first."""
    us = S.timed(cases, REPS)
    first = next(iter(us))
    for k, v in us.items():
        diff = f"  ({v - us[first]:+.1f} against {first})" if k != first else ""
        print(f"   {k:46s} {v:7.1f} us{diff}", flush=True)


def relu_layer(M=4096, N=4096):
    """1: the mixed bfloat16 MLP's hidden layer, forward and backward."""
    print(f"1. ReLU layer, x ({M}, {N}) @ W ({N}, {N}) + b; backward from the next layer's "
          f"gradient ({M}, {N}) and weights ({N}, {N})")
    x, x64 = dev((M, N))
    w, w64 = dev((N, N), N ** -0.5)
    b, b64 = dev((1, N), 0.1)
    y, y_lt, mask = h.allocate((M, N)), h.allocate((M, N)), h.allocate((M * N // 16,))
    y_ref = np.maximum(x64 @ w64 + b64, 0)
    cases = {}
    add(cases, "ours: dot_bias_act relu", lambda: h.dot_bias_act(x, w, b, y, "relu"),
        [(y, y_ref)])
    fwd = Lt(x, w, y_lt, epilogue="RELU_AUX_BIAS", bias=b, aux=mask, aux_ld=N)
    if fwd.search([(y_lt, y_ref)]):
        add(cases, "cuBLASLt RELU_AUX_BIAS (y and the mask)", fwd, [(y_lt, y_ref)])
    report(cases)
    fwd()   # the mask of y_lt, for the backward
    yd = host(y_lt)
    gn, gn64 = dev((M, N))
    wn, wn64 = dev((N, N), N ** -0.5)
    dy_ref = gn64 @ wn64.T
    g_ref = dy_ref * (yd > 0)
    db_ref = g_ref.sum(0, keepdims=True)
    dy, g, db = h.allocate((M, N)), h.allocate((M, N)), h.allocate((1, N))
    deriv = OPS["relu"][1].bind(h, dy, y_lt, g, db)   # (dy, y, g, db)

    def ours():
        h.dot_mm(gn, wn, dy, transb=True)
        deriv()
    cases = {}
    add(cases, "ours: dot_mm, bias_relu_backward", ours, [(g, g_ref), (db, db_ref)])
    g_lt, db_lt, p_lt = h.allocate((M, N)), h.allocate((1, N)), h.allocate((M, N))
    bwd = Lt(gn, wn, g_lt, transb=True, epilogue="DRELU_BGRAD", bias=db_lt, aux=mask, aux_ld=N)
    if bwd.search([(g_lt, g_ref), (db_lt, db_ref)]):
        add(cases, "cuBLASLt DRELU_BGRAD", bwd, [(g_lt, g_ref), (db_lt, db_ref)])
    plain = Lt(gn, wn, p_lt, transb=True)
    if plain.search([(p_lt, dy_ref)]):
        add(cases, "cuBLASLt product alone", plain, [(p_lt, dy_ref)])
    add(cases, "ours: dot_mm alone", lambda: h.dot_mm(gn, wn, dy, transb=True), [(dy, dy_ref)])
    report(cases)


def gelu_layer(M=8192, D=512, F=2048):
    """2 and 3: the GPT's MLP, h = gelu(x @ W1 + b1) forward, and the
    gradient of h from the second product's, dh = dy @ W2^T, backward."""
    print(f"2. GELU forward, x ({M}, {D}) @ W1 ({D}, {F}) + b1")
    x, x64 = dev((M, D))
    w1, w164 = dev((D, F), D ** -0.5)
    b1, b164 = dev((1, F), 0.1)
    s_ref = x64 @ w164 + b164
    z, y, aux = h.allocate((M, F)), h.allocate((M, F)), h.allocate((M, F))
    cases = {}
    for act in ("gelu", "gelu_tanh"):
        fwd = OPS[act][0].bind(h, z, b1, y, aux)   # (z, b, y, aux)

        def ours(fwd=fwd):
            h.dot_mm(x, w1, z)
            fwd()
        add(cases, f"ours: dot_mm, bias_{act}", ours,
            [(y, gelu(s_ref, act == "gelu_tanh")), (aux, s_ref)])
    y_lt, aux_lt, p = h.allocate((M, F)), h.allocate((M, F)), h.allocate((M, F))
    lt_fwd = Lt(x, w1, y_lt, epilogue="GELU_AUX_BIAS", bias=b1, aux=aux_lt, aux_ld=F)
    if lt_fwd.search([(y_lt, gelu(s_ref, True)), (aux_lt, s_ref)]):
        add(cases, "cuBLASLt GELU_AUX_BIAS (tanh; y and its input)", lt_fwd,
            [(y_lt, gelu(s_ref, True)), (aux_lt, s_ref)])
    plain = Lt(x, w1, p)
    if plain.search([(p, x64 @ w164)]):
        add(cases, "cuBLASLt product alone", plain, [(p, x64 @ w164)])
    report(cases)

    print(f"3. GELU backward, dy ({M}, {D}) @ W2^T ({D}, {F}), the derivative and db1")
    lt_fwd()   # aux_lt: the kept input, as the device rounded it
    s = host(aux_lt)
    dy, _ = dev((M, D))
    dy64 = host(dy)
    w2, w264 = dev((F, D), F ** -0.5)
    dh_ref = dy64 @ w264.T
    refs = {}
    for tanh in (False, True):
        g_ref = dh_ref * gelu_deriv(s, tanh)
        refs[tanh] = [(g_ref, g_ref.sum(0, keepdims=True))]
    g_ref, db_ref = refs[True][0]
    dh, g, db = h.allocate((M, F)), h.allocate((M, F)), h.allocate((1, F))
    cases = {}
    for act in ("gelu", "gelu_tanh"):
        deriv = OPS[act][1].bind(h, dh, aux_lt, g, db)   # (dy, s, g, db)

        def ours(deriv=deriv):
            h.dot_mm(dy, w2, dh, transb=True)
            deriv()
        (gr, dbr), = refs[act == "gelu_tanh"]
        add(cases, f"ours: dot_mm, bias_{act}_backward", ours, [(g, gr), (db, dbr)])
    g_lt, db_lt, p = h.allocate((M, F)), h.allocate((1, F)), h.allocate((M, F))
    bwd = Lt(dy, w2, g_lt, transb=True, epilogue="DGELU_BGRAD", bias=db_lt, aux=aux_lt,
             aux_ld=F)
    if bwd.search([(g_lt, g_ref), (db_lt, db_ref)]):
        add(cases, "cuBLASLt DGELU_BGRAD (tanh)", bwd, [(g_lt, g_ref), (db_lt, db_ref)])
    plain = Lt(dy, w2, p, transb=True)
    if plain.search([(p, dh_ref)]):
        add(cases, "cuBLASLt product alone", plain, [(p, dh_ref)])
    report(cases)


print(f"bfloat16 in and out, float32 accumulation; {REPEAT} calls a graph, median of {REPS} "
      f"replays; {'the heuristic first algorithm' if QUICK else f'the fastest of {WANT}'}",
      flush=True)
lt_matmul.run_sections((relu_layer, gelu_layer))
