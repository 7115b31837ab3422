"""``python -m benchmarks streams``: does spreading independent gemms over
stream groups pay?

The LSTM backward pattern: per step, four independent
``dot_add_mm(x, dGate_k, dW_k, transa=True)`` (dW_k (H, H) += x.T dGate_k,
x and dGate_k (B, H)).  Timed as a sequence of 20 steps on one group, and on
four groups with the ordering a real backward pass needs: a fork every step
(groups 1-3 wait for group 0, which wrote that step's dGates) and one join
after the last step (group 0 waits for groups 1-3 before the update reads
every dW; each dW_k is only ever touched by group k, so no step needs more).
PyTorch on four ``torch.cuda`` streams, ordered the same way, is the peer.
Sweep: batch {16, 64, 256} x hidden {256, 1024, 4096}.  Targets: four groups
never more than 5% slower than one; >= 1.3x faster where one gemm leaves the
GPU idle.  The host time to issue a step (one group, four groups) is printed
beside it: where it matches the step's GPU time, the loop is host-bound and
the GPU idles whatever the streams do.
"""
import argparse
import statistics
import time

import numpy as np

from benchmarks.common import gpu_name, print_table, result_name, save_results
from benchmarks.gpu import EventTimer, cuda_handler, optional_peers

F32 = np.float32
STEPS = 20   # steps per timed sequence


def handler_sequence(h, x, dg, dw, groups, steps=STEPS):
    views = [h.with_streams(k % groups) for k in range(4)]
    main, side = views[0], views[1:]

    def sequence(_):
        for _ in range(steps):
            if groups > 1:
                ev = main.record_event()   # fork: this step's dGates come from group 0
                for v in side:
                    v.wait_event(ev)
            for k, v in enumerate(views):
                v.dot_add_mm(x, dg[k], dw[k], transa=True)
        if groups > 1:
            for v in side:
                main.wait_for(v)           # join: the update reads every dW
    return sequence


def torch_sequence(t, x, dg, dw, streams, steps=STEPS):
    main = t.cuda.current_stream()
    xt = x.t()

    def sequence(_):
        for _ in range(steps):
            if streams is None:
                for k in range(4):
                    dw[k].addmm_(xt, dg[k])
                continue
            for k, s in enumerate(streams):
                s.wait_stream(main)
                with t.cuda.stream(s):
                    dw[k].addmm_(xt, dg[k])
        if streams is not None:
            for s in streams:
                main.wait_stream(s)
    return sequence


def host_us_per_step(fn, sync, reps=7):
    """Median host microseconds to issue one step of ``fn`` (a sequence)."""
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn(0)
        times.append(time.perf_counter() - t0)
    sync()
    return statistics.median(times) / STEPS * 1e6


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
    for b in batches:
        for hid in hiddens:
            x = h.create_from_numpy(rng.standard_normal((b, hid)) * 0.01)
            dg = [h.create_from_numpy(rng.standard_normal((b, hid)) * 0.01) for _ in range(4)]
            dw = [h.zeros((hid, hid)) for _ in range(4)]
            seq1, seq4 = handler_sequence(h, x, dg, dw, 1), handler_sequence(h, x, dg, dw, 4)
            one = timer.time(seq1, reps=15, warmup=2) / STEPS
            four = timer.time(seq4, reps=15, warmup=2) / STEPS
            host = host_us_per_step(seq1, h.synchronize_all_streams)
            host4 = host_us_per_step(seq4, h.synchronize_all_streams)
            t1 = t4 = None
            if t is not None:
                tx = t.randn(b, hid, device="cuda") * 0.01
                tg = [t.randn(b, hid, device="cuda") * 0.01 for _ in range(4)]
                tw = [t.zeros(hid, hid, device="cuda") for _ in range(4)]
                t1 = tt.time(torch_sequence(t, tx, tg, tw, None), reps=15, warmup=2) / STEPS
                t4 = tt.time(torch_sequence(t, tx, tg, tw, streams), reps=15, warmup=2) / STEPS
            speed = one / four
            ok = speed >= 1 / 1.05
            bound = "host" if host >= 0.9 * one * 1e3 else "GPU"
            rows.append([b, hid, one * 1e3, four * 1e3, speed, host, host4, bound,
                         (t1 or float("nan")) * 1e3, (t4 or float("nan")) * 1e3,
                         "yes" if ok else "NO", "yes" if speed >= 1.3 else "no"])
            results.append(dict(batch=b, hidden=hid, one_group_us=one * 1e3,
                                four_groups_us=four * 1e3, speedup=speed,
                                host_us_per_step=host, host_us_per_step_four=host4,
                                bound=bound,
                                torch_one_stream_us=t1 and t1 * 1e3,
                                torch_four_streams_us=t4 and t4 * 1e3))
    print(f"\nLSTM backward pattern: 4 x dot_add_mm per step (us per step, median); "
          f"GPU {gpu_name()}")
    print_table(["batch", "hidden", "1 group", "4 groups", "speedup", "host/step (1 group)",
                 "host/step (4 groups)", "1 group is", "torch 1 stream", "torch 4 streams",
                 "not >5% slower", ">=1.3x"],
                rows)
    if args.save:
        print("saved", save_results(result_name("streams", gpu_name()), results))
    return 0
