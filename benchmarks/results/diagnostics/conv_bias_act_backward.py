"""Does cuDNN fuse a ReLU convolution's backward: the activation's derivative
into the backward convolutions, the bias gradient into one reduction?

A diagnostic, not a suite (``python benchmarks/results/diagnostics/
conv_bias_act_backward.py`` on a GPU machine with PyTorch, which only
allocates and times), the backward half of ``conv_bias_act.py`` (whose
helpers it uses: ctypes on ``libcudnn.so.9``, nothing of ours).  Issue 42
asks for "the backward with the activation's derivative and the bias
gradient fused where it can".  Today ``Conv2D`` runs, after a ReLU, one
fused op (dz = dy * (y > 0) and its per-plane sums), a ``sum_t`` over the
images, and the two backward convolutions of dz.  For the conv suite's
layers, batch 64, float32 NCHW and NHWC and bfloat16 NHWC, this asks
cuDNN's heuristics (mode A, then fallback) for engines of these graphs,
and finalizes, checks against float64 NumPy and times (50 executions
captured in a CUDA graph, median of 5 replays) each one our engine policy
allows:

- ``dgrad`` and ``wgrad``: the backward convolutions of dz alone (today's);
- ``drelu+dgrad`` and ``drelu+wgrad``: RELU_BWD (dy, y) into a virtual dz,
  then the backward convolution;
- ``drelu+dbias``: RELU_BWD writing dz and a reduction (ADD) of dz to the
  bias gradient (1, K, 1, 1) in the same graph, today's fused op and sum.
"""
import ctypes

import conv_bias_act as cb  # this folder's, beside the script
import numpy as np
import torch

D_OP_CONV_BWD_DATA, D_OP_CONV_BWD_FILTER = 12, 11
D_REDUCTION, D_OP_REDUCTION = 21, 22
T_REDUCE_OP = 18
A_BWD_DATA_ALPHA, A_BWD_FILTER_ALPHA = 706, 712   # then beta, conv, w-side, x-side, y-side
A_PW_DX, A_PW_DY = 756, 757
A_RED_OP, A_RED_COMP, A_RED_X, A_RED_Y, A_RED_DESC = 1600, 1601, 1610, 1611, 1612
PW_RELU_BWD, REDUCE_ADD = 200, 0


def conv_desc(pad):
    conv = cb.create(cb.D_CONV)
    cb.put(conv, cb.A_CONV_DIMS, cb.T_INT64, [2], ctypes.c_int64)
    cb.put(conv, cb.A_CONV_COMP, cb.T_DATA_TYPE, [cb.FLOAT], ctypes.c_int)
    cb.put(conv, cb.A_CONV_MODE, cb.T_CONV_MODE, [1], ctypes.c_int)
    cb.put(conv, cb.A_CONV_STRIDE, cb.T_INT64, [1, 1], ctypes.c_int64)
    cb.put(conv, cb.A_CONV_PRE, cb.T_INT64, [pad, pad], ctypes.c_int64)
    cb.put(conv, cb.A_CONV_POST, cb.T_INT64, [pad, pad], ctypes.c_int64)
    cb.put(conv, cb.A_CONV_DIL, cb.T_INT64, [1, 1], ctypes.c_int64)
    return cb.finalize(conv, "conv")


def backward_conv(kind, pad, w_side, x_side, y_side):
    """A backward-data (w, dx, dy) or backward-filter (dw, x, dy) operation."""
    op = cb.create(D_OP_CONV_BWD_DATA if kind == "dgrad" else D_OP_CONV_BWD_FILTER)
    base = A_BWD_DATA_ALPHA if kind == "dgrad" else A_BWD_FILTER_ALPHA
    cb.put(op, base, cb.T_FLOAT, [1.0], ctypes.c_float)
    cb.put(op, base + 1, cb.T_FLOAT, [0.0], ctypes.c_float)
    cb.put_desc(op, base + 2, conv_desc(pad))
    cb.put_desc(op, base + 3, w_side)
    cb.put_desc(op, base + 4, x_side)
    cb.put_desc(op, base + 5, y_side)
    return cb.finalize(op, kind)


def relu_backward(dy, y, dz):
    pw = cb.create(cb.D_POINTWISE)
    cb.put(pw, cb.A_PW_MODE, cb.T_PW_MODE, [PW_RELU_BWD], ctypes.c_int)
    cb.put(pw, cb.A_PW_PREC, cb.T_DATA_TYPE, [cb.FLOAT], ctypes.c_int)
    cb.finalize(pw, "relu backward")
    op = cb.create(cb.D_OP_POINTWISE)
    cb.put_desc(op, cb.A_PW_DESC, pw)
    cb.put_desc(op, cb.A_PW_X, y)
    cb.put_desc(op, A_PW_DY, dy)
    cb.put_desc(op, A_PW_DX, dz)
    return cb.finalize(op, "relu backward op")


def reduction(x, y):
    red = cb.create(D_REDUCTION)
    cb.put(red, A_RED_OP, T_REDUCE_OP, [REDUCE_ADD], ctypes.c_int)
    cb.put(red, A_RED_COMP, cb.T_DATA_TYPE, [cb.FLOAT], ctypes.c_int)
    cb.finalize(red, "reduction")
    op = cb.create(D_OP_REDUCTION)
    cb.put_desc(op, A_RED_X, x)
    cb.put_desc(op, A_RED_Y, y)
    cb.put_desc(op, A_RED_DESC, red)
    return cb.finalize(op, "reduction op")


def references(x, w, y, dy, pad):
    """float64 (dz, dx, dw, db) of the backward of y = relu(conv(x, w) + b)."""
    dz = dy * (y > 0)
    xt = torch.from_numpy(x)
    wt = torch.from_numpy(w).requires_grad_(True)
    xt.requires_grad_(True)
    out = torch.nn.functional.conv2d(xt, wt, padding=pad)
    out.backward(torch.from_numpy(dz))
    return dz, xt.grad.numpy(), wt.grad.numpy(), dz.sum(axis=(0, 2, 3))


def run_case(handle, name, xs, ws, pad, label, dtype, nhwc):
    n, c, h, wd = xs
    k, _, r, s = ws
    yd = (n, k, h + 2 * pad - r + 1, wd + 2 * pad - s + 1)
    tdt = torch.float32 if dtype == cb.FLOAT else torch.bfloat16
    rng = np.random.default_rng(1)
    host = {"x": rng.standard_normal(xs), "w": rng.standard_normal(ws) * 0.2,
            "y": np.maximum(rng.standard_normal(yd), 0.0), "dy": rng.standard_normal(yd)}
    mem = torch.channels_last if nhwc else torch.contiguous_format
    dev = {key: torch.from_numpy(v).to("cuda", tdt).contiguous(memory_format=mem)
           for key, v in host.items()}
    held = {key: dev[key].double().cpu().numpy() for key in dev}   # as the device holds them
    dz_ref, dx_ref, dw_ref, db_ref = references(held["x"], held["w"], held["y"], held["dy"], pad)
    for key, shape in (("dz", yd), ("dx", xs), ("dw", ws), ("db", (1, k, 1, 1))):
        dev[key] = torch.empty(shape, device="cuda", dtype=tdt).contiguous(memory_format=mem)
    want = {"dx": dx_ref, "dw": dw_ref, "dz": dz_ref, "db": db_ref.reshape(1, k, 1, 1)}
    uid = {"x": 1, "w": 2, "y": 3, "dy": 4, "dz": 5, "dx": 6, "dw": 7, "db": 8}
    half = dtype != cb.FLOAT

    def t(key, shape, virtual=False):
        return cb.tensor(uid[key] + (20 if virtual else 0), shape, cb.FLOAT if virtual else dtype,
                         nhwc, virtual)

    graphs = {
        "dgrad": lambda: ([backward_conv("dgrad", pad, t("w", ws), t("dx", xs), t("dz", yd))],
                          ["w", "dx", "dz"], "dx"),
        "drelu+dgrad": lambda: (
            [relu_backward(t("dy", yd), t("y", yd), v := t("dz", yd, True)),
             backward_conv("dgrad", pad, t("w", ws), t("dx", xs), v)], ["dy", "y", "w", "dx"],
            "dx"),
        "wgrad": lambda: ([backward_conv("wgrad", pad, t("dw", ws), t("x", xs), t("dz", yd))],
                          ["dw", "x", "dz"], "dw"),
        "drelu+wgrad": lambda: (
            [relu_backward(t("dy", yd), t("y", yd), v := t("dz", yd, True)),
             backward_conv("wgrad", pad, t("dw", ws), t("x", xs), v)], ["dy", "y", "x", "dw"],
            "dw"),
        "drelu+dbias": lambda: (
            [relu_backward(t("dy", yd), t("y", yd), dz := t("dz", yd)),
             reduction(dz, t("db", (1, k, 1, 1)))], ["dy", "y", "dz", "db"], "db"),
    }
    # the plain backward convolutions read dz: give them the reference's
    dev["dz"].copy_(torch.from_numpy(dz_ref).to(tdt).contiguous(memory_format=mem))
    for gname, build in graphs.items():
        try:
            ops, keys, checked = build()
            g = cb.graph(handle, ops)
        except cb.CudnnError as e:
            print(f"{name:7s} {label:14s} {gname:12s} graph refused: {e}")
            continue
        seen, best = set(), None
        for mode, mname in ((cb.HEUR_A, "A"), (cb.HEUR_FALLBACK, "fallback")):
            cfgs, err = cb.configs(g, mode)
            if err:
                print(f"{name:7s} {label:14s} {gname:12s} heuristics {mname}: {err}")
            for cfg in cfgs:
                idx, notes, rtc = cb.describe(cfg)
                if (idx, rtc) in seen:
                    continue
                seen.add((idx, rtc))
                ok = cb.allowed(notes, half)
                ms = err_rel = None
                status = ""
                if ok:
                    try:
                        p, wsz = cb.plan(handle, cfg)
                        buf = torch.empty(max(wsz, 1), dtype=torch.uint8, device="cuda")
                        vp = cb.pack([uid[key] for key in keys],
                                     [dev[key].data_ptr() for key in keys], buf.data_ptr())

                        def run(p=p, vp=vp):
                            cb.check(cb.lib.cudnnBackendExecute(handle, p, vp), "execute")
                        run()
                        torch.cuda.synchronize()
                        got = dev[checked].double().cpu().numpy()
                        err_rel = float(np.abs(got - want[checked]).max()
                                        / np.abs(want[checked]).max())
                        ms = cb.timed(handle, run)
                        best = ms if best is None else min(best, ms)
                    except cb.CudnnError as e:
                        status = str(e)[:60]
                print(f"{name:7s} {label:14s} {gname:12s} {mname:8s} {idx:6d} "
                      f"{'y' if rtc else 'n':3s} {'y' if ok else 'n':3s} "
                      f"{'-' if ms is None else f'{ms:.4f}':>8s} "
                      f"{'-' if err_rel is None else f'{err_rel:.1e}':>8s}  "
                      f"{','.join(notes) or '-'} {status}")
        print(f"  -> {name} {label} {gname}: fastest allowed {best} ms")


def main():
    print(f"cuDNN {cb.lib.cudnnGetVersion()}, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")
    handle = ctypes.c_void_p()
    cb.check(cb.lib.cudnnCreate(ctypes.byref(handle)), "cudnnCreate")
    print(f"{'case':7s} {'format':14s} {'graph':12s} {'heur':8s} {'engine':>6s} {'rtc':3s} "
          f"{'ok':3s} {'ms':>8s} {'err':>8s}  notes / status")
    for name, (xs, ws, pad) in cb.CASES.items():
        for label, dtype, nhwc in cb.FORMATS:
            run_case(handle, name, xs, ws, pad, label, dtype, nhwc)


if __name__ == "__main__":
    main()
