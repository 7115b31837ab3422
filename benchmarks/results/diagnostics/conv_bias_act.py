"""Does cuDNN fuse a convolution with its bias and ReLU at our shapes?

A diagnostic, not a suite (``python benchmarks/results/diagnostics/
conv_bias_act.py`` on a GPU machine with PyTorch, which here only allocates
and times): issue 42's second item asks for convolution, bias and
activation in one cuDNN engine "where cuDNN offers one".  For the conv
suite's layers (the two LeNet layers, the ResNet block's 3x3x64 layer),
batch 64, it builds two operation graphs through cuDNN's backend API
(ctypes on ``libcudnn.so.9``, nothing of ours):

- ``conv``: the forward convolution alone (what ``conv2d`` runs today);
- ``fused``: the same convolution into a virtual tensor, a pointwise ADD of
  the bias (1, K, 1, 1) into a second virtual tensor and a pointwise
  RELU_FWD into the output.

For each graph, format (float32 NCHW, float32 NHWC, bfloat16 NHWC) and
heuristics mode (A, then the fallback list), it lists every engine
configuration cuDNN returns with its global index and notes, marks those our
engine policy allows (``handlers.cuda.convolution.refused_notes``: float32
takes no tensor cores, that is TF32; no format takes down-converted inputs
or reduced-precision sums; runtime-compiled engines allowed here, since the
question is whether one exists), finalizes them, checks the output against
float64 NumPy and times 50 executions captured in a CUDA graph (median of
5 replays).  The bias-and-ReLU kernel PyTorch runs after a convolution is
timed the same way, for scale.
"""
import ctypes
import os
import statistics

import numpy as np
import torch

# cuDNN 9 enum values (cudnn_graph.h), as in handlers/cuda/_cudnn.c
D_POINTWISE, D_CONV, D_ENGINE, D_ENGINECFG, D_ENGINEHEUR, D_PLAN = 0, 1, 2, 3, 4, 5
D_OP_CONV_FWD, D_OP_POINTWISE, D_GRAPH, D_PACK, D_TENSOR = 10, 13, 15, 16, 17
T_HANDLE, T_DATA_TYPE, T_BOOL, T_INT64, T_FLOAT, T_VOID_PTR = 0, 1, 2, 3, 4, 6
T_CONV_MODE, T_HEUR_MODE, T_NOTE, T_PW_MODE, T_DESC, T_BEHAVIOR = 7, 8, 11, 14, 15, 19
A_PW_MODE, A_PW_PREC = 0, 1
A_CONV_COMP, A_CONV_MODE, A_CONV_DIL, A_CONV_STRIDE, A_CONV_POST, A_CONV_PRE, A_CONV_DIMS = \
    100, 101, 102, 103, 104, 105, 106
A_HEUR_MODE, A_HEUR_GRAPH, A_HEUR_RESULTS = 200, 201, 202
A_CFG_ENGINE = 300
A_PLAN_HANDLE, A_PLAN_CFG, A_PLAN_WS = 400, 401, 402
A_FWD_ALPHA = 700       # then beta, conv desc, w, x, y
A_PW_DESC, A_PW_X, A_PW_B, A_PW_Y = 750, 751, 752, 753
A_GRAPH_HANDLE, A_GRAPH_OPS = 800, 801
A_T_ALIGN, A_T_TYPE, A_T_DIMS, A_T_STRIDES, A_T_UID, A_T_VIRTUAL = 900, 901, 902, 903, 906, 907
A_PACK_UIDS, A_PACK_PTRS, A_PACK_WS = 1000, 1001, 1003
A_ENG_INDEX, A_ENG_NOTE, A_ENG_BEHAVIOR = 1301, 1303, 1305
PW_ADD, PW_RELU = 0, 100
HEUR_A, HEUR_FALLBACK = 3, 2
FLOAT, BF16 = 0, 9
NOTES = ("tensor_core", "down_convert_inputs", "reduced_precision_reduction", "fft",
         "nondeterministic", "winograd", "winograd_tile_4x4", "winograd_tile_6x6",
         "winograd_tile_13x13", "strict_nan_prop")

CASES = {"lenet1": ((64, 1, 28, 28), (6, 1, 5, 5), 0),
         "lenet2": ((64, 6, 12, 12), (16, 6, 5, 5), 0),
         "resnet": ((64, 64, 56, 56), (64, 64, 3, 3), 1)}
FORMATS = [("float32 NCHW", FLOAT, False), ("float32 NHWC", FLOAT, True),
           ("bfloat16 NHWC", BF16, True)]


def load():
    """libcudnn.so.9: the nvidia.cudnn wheel's (the one PyTorch loaded) or the soname."""
    try:
        import nvidia.cudnn as pkg
        for d in pkg.__path__:
            path = os.path.join(d, "lib", "libcudnn.so.9")
            if os.path.exists(path):
                return ctypes.CDLL(path)
    except ImportError:
        pass
    return ctypes.CDLL("libcudnn.so.9")


lib = load()
lib.cudnnBackendSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                         ctypes.c_int64, ctypes.c_void_p]
lib.cudnnBackendGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                         ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                                         ctypes.c_void_p]
lib.cudnnBackendFinalize.argtypes = [ctypes.c_void_p]
lib.cudnnBackendDestroyDescriptor.argtypes = [ctypes.c_void_p]
lib.cudnnBackendExecute.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
lib.cudnnSetStream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.cudnnGetErrorString.restype = ctypes.c_char_p


class CudnnError(RuntimeError):
    pass


def check(status, what):
    if status:
        raise CudnnError(f"{what}: {lib.cudnnGetErrorString(status).decode()} ({status})")


def create(kind):
    d = ctypes.c_void_p()
    check(lib.cudnnBackendCreateDescriptor(kind, ctypes.byref(d)), f"create {kind}")
    return d


def put(d, attr, typ, values, ctype):
    arr = (ctype * len(values))(*values)
    check(lib.cudnnBackendSetAttribute(d, attr, typ, len(values), arr), f"set {attr}")


def put_desc(d, attr, *descs):
    arr = (ctypes.c_void_p * len(descs))(*[x.value for x in descs])
    check(lib.cudnnBackendSetAttribute(d, attr, T_DESC, len(descs), arr), f"set {attr}")


def finalize(d, what):
    check(lib.cudnnBackendFinalize(d), f"finalize {what}")
    return d


def tensor(uid, dims, dtype, nhwc, virtual=False):
    n, c, h, w = dims
    strides = (h * w * c, 1, w * c, c) if nhwc else (c * h * w, h * w, w, 1)
    t = create(D_TENSOR)
    put(t, A_T_TYPE, T_DATA_TYPE, [dtype], ctypes.c_int)
    put(t, A_T_DIMS, T_INT64, dims, ctypes.c_int64)
    put(t, A_T_STRIDES, T_INT64, strides, ctypes.c_int64)
    put(t, A_T_UID, T_INT64, [uid], ctypes.c_int64)
    put(t, A_T_ALIGN, T_INT64, [16], ctypes.c_int64)
    if virtual:
        put(t, A_T_VIRTUAL, T_BOOL, [True], ctypes.c_bool)
    return finalize(t, "tensor")


def conv_op(x, w, y, pad):
    conv = create(D_CONV)
    put(conv, A_CONV_DIMS, T_INT64, [2], ctypes.c_int64)
    put(conv, A_CONV_COMP, T_DATA_TYPE, [FLOAT], ctypes.c_int)
    put(conv, A_CONV_MODE, T_CONV_MODE, [1], ctypes.c_int)   # cross-correlation
    put(conv, A_CONV_STRIDE, T_INT64, [1, 1], ctypes.c_int64)
    put(conv, A_CONV_PRE, T_INT64, [pad, pad], ctypes.c_int64)
    put(conv, A_CONV_POST, T_INT64, [pad, pad], ctypes.c_int64)
    put(conv, A_CONV_DIL, T_INT64, [1, 1], ctypes.c_int64)
    finalize(conv, "conv")
    op = create(D_OP_CONV_FWD)
    put(op, A_FWD_ALPHA, T_FLOAT, [1.0], ctypes.c_float)
    put(op, A_FWD_ALPHA + 1, T_FLOAT, [0.0], ctypes.c_float)
    put_desc(op, A_FWD_ALPHA + 2, conv)
    put_desc(op, A_FWD_ALPHA + 3, w)
    put_desc(op, A_FWD_ALPHA + 4, x)
    put_desc(op, A_FWD_ALPHA + 5, y)
    return finalize(op, "conv op")


def pointwise(mode, x, b, y):
    pw = create(D_POINTWISE)
    put(pw, A_PW_MODE, T_PW_MODE, [mode], ctypes.c_int)
    put(pw, A_PW_PREC, T_DATA_TYPE, [FLOAT], ctypes.c_int)
    finalize(pw, "pointwise")
    op = create(D_OP_POINTWISE)
    put_desc(op, A_PW_DESC, pw)
    put_desc(op, A_PW_X, x)
    if b is not None:
        put_desc(op, A_PW_B, b)
    put_desc(op, A_PW_Y, y)
    return finalize(op, "pointwise op")


def graph(handle, ops):
    g = create(D_GRAPH)
    put(g, A_GRAPH_HANDLE, T_HANDLE, [handle.value], ctypes.c_void_p)
    put_desc(g, A_GRAPH_OPS, *ops)
    return finalize(g, "graph")


def get_ints(d, attr, typ, most=32):
    n = ctypes.c_int64(0)
    arr = (ctypes.c_int * most)()
    if lib.cudnnBackendGetAttribute(d, attr, typ, most, ctypes.byref(n), arr):
        return []
    return list(arr[:n.value])


def configs(g, mode):
    """The engine configurations heuristics ``mode`` ranks for graph g."""
    heur = create(D_ENGINEHEUR)
    put_desc(heur, A_HEUR_GRAPH, g)
    put(heur, A_HEUR_MODE, T_HEUR_MODE, [mode], ctypes.c_int)
    try:
        finalize(heur, "heuristics")
    except CudnnError as e:
        return [], str(e)
    n = ctypes.c_int64(0)
    check(lib.cudnnBackendGetAttribute(heur, A_HEUR_RESULTS, T_DESC, 0, ctypes.byref(n), None),
          "results count")
    cfgs = [create(D_ENGINECFG) for _ in range(n.value)]
    arr = (ctypes.c_void_p * len(cfgs))(*[c.value for c in cfgs])
    got = ctypes.c_int64(0)
    check(lib.cudnnBackendGetAttribute(heur, A_HEUR_RESULTS, T_DESC, len(cfgs),
                                       ctypes.byref(got), arr), "results")
    return [ctypes.c_void_p(arr[i]) for i in range(got.value)], ""


def describe(cfg):
    """(global index, numerical note names, runtime-compiled) of an engine config."""
    eng = create(D_ENGINE)
    n = ctypes.c_int64(0)
    arr = (ctypes.c_void_p * 1)(eng.value)
    check(lib.cudnnBackendGetAttribute(cfg, A_CFG_ENGINE, T_DESC, 1, ctypes.byref(n), arr),
          "engine")
    idx = ctypes.c_int64(-1)
    lib.cudnnBackendGetAttribute(eng, A_ENG_INDEX, T_INT64, 1, ctypes.byref(n),
                                 ctypes.byref(idx))
    notes = [NOTES[i] if 0 <= i < len(NOTES) else str(i) for i in get_ints(eng, A_ENG_NOTE,
                                                                           T_NOTE)]
    rtc = 0 in get_ints(eng, A_ENG_BEHAVIOR, T_BEHAVIOR)
    return idx.value, notes, rtc


def allowed(notes, half):
    refused = {"down_convert_inputs", "reduced_precision_reduction"}
    refused |= {"fft", "winograd", "winograd_tile_4x4", "winograd_tile_6x6",
                "winograd_tile_13x13"} if half else {"tensor_core"}
    return not refused & set(notes)


def plan(handle, cfg):
    p = create(D_PLAN)
    put(p, A_PLAN_HANDLE, T_HANDLE, [handle.value], ctypes.c_void_p)
    put_desc(p, A_PLAN_CFG, cfg)
    finalize(p, "plan")
    ws, n = ctypes.c_int64(0), ctypes.c_int64(0)
    check(lib.cudnnBackendGetAttribute(p, A_PLAN_WS, T_INT64, 1, ctypes.byref(n),
                                       ctypes.byref(ws)), "workspace")
    return p, ws.value


def pack(uids, ptrs, ws_ptr):
    vp = create(D_PACK)
    put(vp, A_PACK_UIDS, T_INT64, uids, ctypes.c_int64)
    put(vp, A_PACK_PTRS, T_VOID_PTR, ptrs, ctypes.c_void_p)
    put(vp, A_PACK_WS, T_VOID_PTR, [ws_ptr], ctypes.c_void_p)
    return finalize(vp, "variant pack")


def timed(handle, fn, reps=50):
    """Median ms of one fn() over 5 replays of a graph of ``reps`` calls."""
    g = torch.cuda.CUDAGraph()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        lib.cudnnSetStream(handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        for _ in range(reps):
            fn()
    lib.cudnnSetStream(handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def reference(x, w, bias, pad):
    """float64 NumPy: relu(conv(x, w) + bias), NCHW."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    p, q = h + 2 * pad - r + 1, wd + 2 * pad - s + 1
    cols = np.lib.stride_tricks.sliding_window_view(xp, (r, s), axis=(2, 3))  # n c p q r s
    y = np.einsum("ncpqrs,kcrs->nkpq", cols[:, :, :p, :q], w)
    return np.maximum(y + bias.reshape(1, k, 1, 1).astype(np.float64), 0.0)


def run_case(handle, name, xs, ws_shape, pad, label, dtype, nhwc):
    n, c, h, wd = xs
    k, _, r, s = ws_shape
    yd = (n, k, h + 2 * pad - r + 1, wd + 2 * pad - s + 1)
    tdt = torch.float32 if dtype == FLOAT else torch.bfloat16
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws_shape).astype(np.float32) * 0.2
    bias = rng.standard_normal(k).astype(np.float32)
    mem = torch.channels_last if nhwc else torch.contiguous_format
    tx = torch.from_numpy(x).to("cuda", tdt).contiguous(memory_format=mem)
    tw = torch.from_numpy(w).to("cuda", tdt).contiguous(memory_format=mem)
    tb = torch.from_numpy(bias).to("cuda", tdt).reshape(1, k, 1, 1)
    ty = torch.empty(yd, device="cuda", dtype=tdt).contiguous(memory_format=mem)
    ref = reference(tx.float().cpu().numpy(), tw.float().cpu().numpy(),
                    tb.float().cpu().numpy().ravel(), pad)
    half = dtype != FLOAT
    rows = []
    for fused in (False, True):
        X, W = tensor(1, xs, dtype, nhwc), tensor(2, ws_shape, dtype, nhwc)
        Y = tensor(3, yd, dtype, nhwc)
        if fused:
            B = tensor(4, (1, k, 1, 1), dtype, nhwc)
            v1 = tensor(10, yd, FLOAT, nhwc, virtual=True)
            v2 = tensor(11, yd, FLOAT, nhwc, virtual=True)
            ops = [conv_op(X, W, v1, pad), pointwise(PW_ADD, v1, B, v2),
                   pointwise(PW_RELU, v2, None, Y)]
            uids, ptrs = [1, 2, 3, 4], [tx.data_ptr(), tw.data_ptr(), ty.data_ptr(), tb.data_ptr()]
        else:
            ops = [conv_op(X, W, Y, pad)]
            uids, ptrs = [1, 2, 3], [tx.data_ptr(), tw.data_ptr(), ty.data_ptr()]
        try:
            g = graph(handle, ops)
        except CudnnError as e:
            print(f"{name:7s} {label:14s} {'fused' if fused else 'conv':5s} graph refused: {e}")
            continue
        seen = set()
        for mode, mname in ((HEUR_A, "A"), (HEUR_FALLBACK, "fallback")):
            cfgs, err = configs(g, mode)
            if err:
                print(f"{name:7s} {label:14s} {'fused' if fused else 'conv':5s} "
                      f"heuristics {mname}: {err}")
            for cfg in cfgs:
                idx, notes, rtc = describe(cfg)
                if (idx, rtc) in seen:
                    continue
                seen.add((idx, rtc))
                ok = allowed(notes, half)
                row = dict(case=name, fmt=label, graph="fused" if fused else "conv", heur=mname,
                           engine=idx, notes=",".join(notes) or "-", rtc=rtc, allowed=ok,
                           ms=None, err=None, status="")
                if ok:
                    try:
                        p, wsz = plan(handle, cfg)
                        buf = torch.empty(max(wsz, 1), dtype=torch.uint8, device="cuda")
                        vp = pack(uids, ptrs, buf.data_ptr())
                        def run(p=p, vp=vp):
                            check(lib.cudnnBackendExecute(handle, p, vp), "execute")
                        run()
                        torch.cuda.synchronize()
                        got = ty.float().cpu().numpy().astype(np.float64)
                        want = ref if fused else None
                        if want is not None:
                            scale = np.abs(want).max()
                            row["err"] = float(np.abs(got - want).max() / scale)
                        row["ms"] = timed(handle, run)
                    except CudnnError as e:
                        row["status"] = str(e)[:60]
                rows.append(row)
    return rows, tx, tb, ty


def main():
    print(f"cuDNN {lib.cudnnGetVersion()}, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")
    torch.backends.cudnn.allow_tf32 = False
    handle = ctypes.c_void_p()
    check(lib.cudnnCreate(ctypes.byref(handle)), "cudnnCreate")
    print(f"{'case':7s} {'format':14s} {'graph':5s} {'heur':8s} {'engine':>6s} "
          f"{'rtc':3s} {'ok':3s} {'ms':>8s} {'err':>8s}  notes / status")
    for name, (xs, wsh, pad) in CASES.items():
        for label, dtype, nhwc in FORMATS:
            rows, tx, tb, ty = run_case(handle, name, xs, wsh, pad, label, dtype, nhwc)
            for r in rows:
                ms = f"{r['ms']:.4f}" if r["ms"] is not None else "-"
                err = f"{r['err']:.1e}" if r["err"] is not None else "-"
                print(f"{r['case']:7s} {r['fmt']:14s} {r['graph']:5s} {r['heur']:8s} "
                      f"{r['engine']:6d} {'y' if r['rtc'] else 'n':3s} "
                      f"{'y' if r['allowed'] else 'n':3s} {ms:>8s} {err:>8s}  {r['notes']} "
                      f"{r['status']}")
            best = {g: min((r["ms"] for r in rows if r["graph"] == g and r["ms"]), default=None)
                    for g in ("conv", "fused")}
            after = timed(handle, lambda: torch.relu_(ty.add_(tb)))
            print(f"  -> {name} {label}: fastest allowed conv {best['conv']} ms, fastest allowed "
                  f"fused {best['fused']} ms; PyTorch's add + relu after it {after:.4f} ms")


if __name__ == "__main__":
    main()
