"""``python -m benchmarks streams``: does spreading independent gemms over
stream groups pay?

The LSTM backward pattern: per step, four independent
``dot_add_mm(x, dGate_k, dW_k, transa=True)`` (dW_k (H, H) += x.T dGate_k,
x and dGate_k (B, H)).  Timed on one group, and on four groups with the fork
(groups 1-3 wait for group 0) and join (group 0 waits for them) a real step
needs.  PyTorch on four ``torch.cuda`` streams is the peer.  Sweep: batch
{16, 64, 256} x hidden {256, 1024, 4096}.  Targets: four groups never more
than 5% slower than one; >= 1.3x faster where one gemm leaves the GPU idle.
"""
import argparse

import numpy as np

from benchmarks.common import gpu_name, print_table, result_name, save_results
from benchmarks.gpu import EventTimer, cuda_handler, optional_peers

F32 = np.float32


def handler_step(h, x, dg, dw, groups):
    views = [h.with_streams(k % groups) for k in range(4)]
    main = views[0]

    def step(_):
        if groups > 1:
            ev = main.record_event()   # fork: dGates were written on group 0
            for v in views[1:]:
                v.wait_event(ev)
        for k, v in enumerate(views):
            v.dot_add_mm(x, dg[k], dw[k], transa=True)
        if groups > 1:
            for v in views[1:]:
                main.wait_for(v)       # join: the update reads every dW
    return step


def torch_step(t, x, dg, dw, streams):
    main = t.cuda.current_stream()
    xt = x.t()

    def step(_):
        if streams is None:
            for k in range(4):
                dw[k].addmm_(xt, dg[k])
            return
        for k, s in enumerate(streams):
            s.wait_stream(main)
            with t.cuda.stream(s):
                dw[k].addmm_(xt, dg[k])
        for s in streams:
            main.wait_stream(s)
    return step


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks streams", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--blas", default="scikit-cuda", choices=("scikit-cuda", "nvmath"),
                        help="cuBLAS binding of the handler (default scikit-cuda)")
    args = parser.parse_args(argv)
    h = cuda_handler("streams", F32, num_stream_groups=4, blas=args.blas)
    if h is None:
        return 0
    peers = optional_peers()
    t = peers.get("torch")
    timer = EventTimer("pycuda", h.stream)
    if t is not None:
        tt = EventTimer("torch", module=t)
        streams = [t.cuda.Stream() for _ in range(4)]
    batches, hiddens = ([16, 64], [256, 1024]) if args.quick else ([16, 64, 256], [256, 1024, 4096])
    rng = np.random.default_rng(0)
    rows, results = [], []
    steps = 20
    for b in batches:
        for hid in hiddens:
            x = h.create_from_numpy(rng.standard_normal((b, hid)) * 0.01)
            dg = [h.create_from_numpy(rng.standard_normal((b, hid)) * 0.01) for _ in range(4)]
            dw = [h.zeros((hid, hid)) for _ in range(4)]
            one = timer.time(handler_step(h, x, dg, dw, 1), reps=15, warmup=5, inner=steps)
            four = timer.time(handler_step(h, x, dg, dw, 4), reps=15, warmup=5, inner=steps)
            t1 = t4 = None
            if t is not None:
                tx = t.randn(b, hid, device="cuda") * 0.01
                tg = [t.randn(b, hid, device="cuda") * 0.01 for _ in range(4)]
                tw = [t.zeros(hid, hid, device="cuda") for _ in range(4)]
                t1 = tt.time(torch_step(t, tx, tg, tw, None), reps=15, warmup=5, inner=steps)
                t4 = tt.time(torch_step(t, tx, tg, tw, streams), reps=15, warmup=5, inner=steps)
            speed = one / four
            ok = speed >= 1 / 1.05
            rows.append([b, hid, one * 1e3, four * 1e3, speed,
                         (t1 or float("nan")) * 1e3, (t4 or float("nan")) * 1e3,
                         "yes" if ok else "NO", "yes" if speed >= 1.3 else "no"])
            results.append(dict(batch=b, hidden=hid, one_group_us=one * 1e3,
                                four_groups_us=four * 1e3, speedup=speed,
                                torch_one_stream_us=t1 and t1 * 1e3,
                                torch_four_streams_us=t4 and t4 * 1e3))
    print(f"\nLSTM backward pattern: 4 x dot_add_mm per step (us per step, median); "
          f"GPU {gpu_name()}")
    print_table(["batch", "hidden", "1 group", "4 groups", "speedup", "torch 1 stream",
                 "torch 4 streams", "not >5% slower", ">=1.3x"], rows)
    if args.save:
        print("saved", save_results(result_name("streams", gpu_name()), results))
    return 0
