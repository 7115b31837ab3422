"""``python -m benchmarks streams``: does spreading independent gemms over
stream groups pay?

The LSTM backward pattern: per step, four independent
``dot_add_mm(x, dGate_k, dW_k, transa=True)`` (dW_k (H, H) += x.T dGate_k,
x and dGate_k (B, H)).  Timed as a sequence of 20 steps on one group, and on
four groups with the ordering a real backward pass needs: a fork every step
(groups 1-3 wait for group 0, which wrote that step's dGates) and one join
after the last step (group 0 waits for groups 1-3 before the update reads
every dW; each dW_k is only ever touched by group k, so no step needs more).
Sweep: batch {16, 64, 256} x hidden {256, 1024, 4096}.  Targets: four groups
never more than 5% slower than one; >= 1.3x faster where one gemm leaves the
GPU idle.

PyTorch is the peer, on the same inputs (the host arrays uploaded to each
library; TF32 off), written as an expert would: on one stream, the same 80
``addmm_`` per sequence; on four streams (the current one and three side
streams) with the same ordering: the main stream issues its 20 steps,
recording one preallocated event per step, then each side stream, inside one
``with torch.cuda.stream(s):``, issues its 20 steps, each waiting on that
step's event; the main stream joins the side streams at the end.

Timing: per sweep cell, ours on one and on four groups and PyTorch on one and
on four streams are timed in interleaved order (``benchmarks.gpu.interleaved``:
CUDA events of each library on the stream that issues, 15 samples of one
20-step sequence each after 2 warm-ups); figures are microseconds per step.

Host- or GPU-bound ("1 group is"): two figures measured apart.  *Host issue*:
the host's time to issue one sequence, the device synchronized before (outside
the clock) and no synchronize at the end.  *Device*: the sequence's event time
with the host far ahead: gemms queued on group 0 before the start event keep
the device busy for twice the longest host issue time plus 0.5 ms, so that the
whole sequence is queued before it starts to run.  "host" only where the host
issue time exceeds the device time (one group's medians).

Under capture (the same sweep, each sequence captured once as a graph and
replayed; the figures are replays): ours on one and on four groups
(``Handler.capture``; the fork and join become graph edges) and PyTorch on one
and on four streams (``torch.cuda.graph``, three warm-up sequences on a side
stream first).  A replay costs the host a few microseconds, so these cells
show what the GPU does with the work, not how fast the host issues it.
Targets: four groups captured never more than 2% slower than one group
captured in any cell, and >= 1.3x faster wherever one gemm leaves the GPU
partly idle.  Partly idle is measured, not guessed: the same 20 steps with
one gemm of four times the output per step (``x.T @ [dG_0 .. dG_3]`` into an
(H, 4H) dW), captured too; its gain ``idle_gain`` = one group captured /
that wide gemm is what filling the GPU can win in that cell, and a cell
counts as partly idle where it exceeds 1.05.  Where it is below 1.3 it bounds
what four groups can reach.

Check: the dW buffers zeroed, one sequence of each variant (ours on one and
four groups, eager and captured, PyTorch on one and four streams, eager and
graphed), then each dW_k against
``STEPS * x.T @ dGate_k`` in float64 NumPy on the same float32 inputs: max
relative error within 1e-4.  ``main`` returns 1 if a check fails.

Saved results (``--save``): ``{"rows": [...], "checks": [...]}``.  A row has
``batch``, ``hidden``; spreads of microseconds per step: ``one_group_us``,
``four_groups_us``, ``torch_one_stream_us`` and ``torch_four_streams_us``
(None without PyTorch), ``host_us_per_step`` and ``host_us_per_step_four``
(host issue, one and four groups), ``device_us_per_step`` and
``device_us_per_step_four`` (device time with the host far ahead, one and
four groups); under capture, spreads ``one_group_captured_us``,
``four_groups_captured_us``, ``wide_captured_us``, ``torch_graphed_one_us``
and ``torch_graphed_four_us`` (None without PyTorch); plain numbers:
``speedup`` (one group over four, from the medians), ``speedup_captured``
(the same, captured), ``idle_gain`` (one group captured over the wide gemm),
``hold_ms`` (the device time queued ahead of each device sample); ``bound``
("host" or "GPU"); ``partly_idle`` (``idle_gain`` > 1.05).  A check is
``{"what", "errors": {variant: max relative error}, "tol", "ok"}``.
"""
import math

import numpy as np

from benchmarks.common import (
    Run,
    check_line,
    derive,
    gpu_name,
    med,
    print_table,
    rel_error,
    spread,
    suite_parser,
)
from benchmarks.gpu import (
    EventTimer,
    cuda_handler,
    host_overhead,
    interleaved,
    optional_peers,
    our_captured,
    torch_graphed,
)

F32 = np.float32
STEPS = 20      # steps per timed sequence
REPS = 15       # samples per figure
WARMUP = 2      # untimed sequences before the samples
TOL = 1e-4      # relative error allowed in the dW check (float32 gemms)
HOLD_N = 2048   # size of the gemms that keep the device busy (see make_hold)
CAPTURED_SLOWER = 1.02   # four groups captured: at most 2% slower than one
IDLE = 1.05     # a cell is partly idle where the wide gemm gains more than this


def handler_sequence(h, x, dg, dw, groups, steps=STEPS):
    """fn(i): one sequence of ``steps`` steps of four ``dot_add_mm`` on
    ``groups`` (1 or 4) stream groups, forked every step and joined at the end."""
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


def torch_sequence(t, x, dg, dw, side, steps=STEPS):
    """fn(i): the same sequence in PyTorch, on the current stream alone
    (``side`` None) or on it and the three streams of ``side``."""
    xt = x.t()
    if side is None:
        def one_stream(_):
            for _ in range(steps):
                for k in range(4):
                    dw[k].addmm_(xt, dg[k])
        return one_stream
    # One event per step, made once: creating events in the loop would cost
    # the peer host time that ours does not spend.
    forks = [t.cuda.Event() for _ in range(steps)]

    def four_streams(_):
        main = t.cuda.current_stream()     # at call time: the capturing stream in a graph
        for i in range(steps):
            forks[i].record(main)          # fork: this step's dGates come from main
            dw[0].addmm_(xt, dg[0])
        for k, s in enumerate(side, start=1):
            with t.cuda.stream(s):         # entered once per sequence, not once per step
                for i in range(steps):
                    s.wait_event(forks[i])
                    dw[k].addmm_(xt, dg[k])
        for s in side:
            main.wait_stream(s)            # join: the update reads every dW
    return four_streams


def wide_sequence(h, x, dg, dw, steps=STEPS):
    """fn(i): ``steps`` steps of one ``dot_add_mm`` with four times the output
    (``dg`` (B, 4H), ``dw`` (H, 4H)) on group 0: the same flops as one step of
    :func:`handler_sequence`, in one gemm that can fill the GPU."""
    def sequence(_):
        for _ in range(steps):
            h.dot_add_mm(x, dg, dw, transa=True)
    return sequence


def make_hold(h, timer):
    """Return ``hold(ms)``: queue gemms on group 0 that keep the device busy
    for at least ``ms`` milliseconds (the count from one gemm's event time).

    Queued before a sample's start event, they let the host issue the whole
    sequence before the device reaches it, so the sample measures the
    device's time alone, not the host's pace."""
    rng = np.random.default_rng(1)
    a = h.create_from_numpy(rng.standard_normal((HOLD_N, HOLD_N)).astype(F32))
    c = h.allocate((HOLD_N, HOLD_N))
    gemm_ms = timer.time(lambda i: h.dot_mm(a, a, c), reps=5, warmup=2)

    def hold(ms):
        for _ in range(max(1, math.ceil(ms / gemm_ms))):
            h.dot_mm(a, a, c)
    return hold


def device_ahead(timer, hold, hold_ms, seqs, reps=REPS):
    """``{label: spread of ms per sequence}`` of the sequences ``seqs``
    (``{label: fn}``, issuing on ``timer``'s stream), each sample taken behind
    ``hold(hold_ms)``; the labels take turns, the first rotating each round."""
    labels = list(seqs)
    samples = {k: [] for k in labels}
    for r in range(reps):
        for j in range(len(labels)):
            k = labels[(r + j) % len(labels)]
            hold(hold_ms)   # queued before the start event that sample() records
            samples[k].append(timer.sample(seqs[k], r))
    return {k: spread(v) for k, v in samples.items()}


def per_step_us(ms):
    """A spread of milliseconds per sequence as microseconds per step."""
    return derive(ms, lambda v: v / STEPS * 1e3)


def ours_dw(h, dw, seq):
    """run(): zero ``dw`` (ours), issue one sequence ``seq``, return the dW."""
    def run():
        h.synchronize_all_streams()   # the timings' work is done before the zeroing
        for w in dw:
            h.fill(w, 0.0)
        seq(0)
        h.synchronize_all_streams()
        return [h.get_numpy_copy(w) for w in dw]
    return run


def torch_dw(t, dw, seq):
    """run(): zero ``dw`` (PyTorch), issue one sequence ``seq``, return the dW."""
    def run():
        t.cuda.synchronize()
        for w in dw:
            w.zero_()
        seq(0)
        t.cuda.synchronize()
        return [w.cpu().numpy() for w in dw]
    return run


def check_dw(dw_of, x_h, dg_h):
    """``{variant: max relative error}`` of each variant's dW against float64.

    ``dw_of`` is ``{variant: run}``: ``run()`` zeroes the variant's dW
    buffers, issues one sequence and returns the four dW as NumPy arrays."""
    x = x_h.astype(np.float64)
    refs = [STEPS * (x.T @ g.astype(np.float64)) for g in dg_h]
    errors = {}
    for name, run in dw_of.items():
        got = run()
        errors[name] = max(rel_error(w, ref) for w, ref in zip(got, refs))
    return errors


def main(argv=None):
    """Run the sweep, print the table and the checks; 1 if a check failed."""
    parser = suite_parser("streams", __doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--blas", default="scikit-cuda", choices=("scikit-cuda", "nvmath"),
                        help="cuBLAS binding of the handler (default scikit-cuda)")
    args = parser.parse_args(argv)
    run = Run("streams", gpu_name(), vars(args))
    h = cuda_handler("streams", F32, num_stream_groups=4, blas=args.blas)
    if h is None:
        return 0
    t = optional_peers().get("torch")
    timer = EventTimer("pycuda", h.stream)
    hold = make_hold(h, timer)
    if t is not None:
        tt = EventTimer("torch", module=t)
        side = [t.cuda.Stream() for _ in range(3)]
    batches, hiddens = ([16, 64], [256, 1024]) if args.quick else ([16, 64, 256], [256, 1024, 4096])
    rng = np.random.default_rng(0)
    rows, table, ctable, checks = [], [], [], []
    for b in batches:
        for hid in hiddens:
            # float32 on the host: ours, PyTorch and the reference share the inputs
            x_h = (rng.standard_normal((b, hid)) * 0.01).astype(F32)
            dg_h = [(rng.standard_normal((b, hid)) * 0.01).astype(F32) for _ in range(4)]
            x = h.create_from_numpy(x_h)
            dg = [h.create_from_numpy(g) for g in dg_h]
            dw = [h.zeros((hid, hid)) for _ in range(4)]
            seq1, seq4 = handler_sequence(h, x, dg, dw, 1), handler_sequence(h, x, dg, dw, 4)
            cases = {"one": (timer, seq1), "four": (timer, seq4)}
            if t is not None:
                tx = t.from_numpy(x_h).cuda()
                tg = [t.from_numpy(g).cuda() for g in dg_h]
                tw = [t.zeros(hid, hid, device="cuda") for _ in range(4)]
                tseq1 = torch_sequence(t, tx, tg, tw, None)
                tseq4 = torch_sequence(t, tx, tg, tw, side)
                cases["torch1"], cases["torch4"] = (tt, tseq1), (tt, tseq4)
            us = {k: per_step_us(v) for k, v in interleaved(cases, REPS, WARMUP).items()}

            # Host issue: one sequence per sample, the device idle at the start
            # (host_overhead synchronizes between turns, outside the clock) and
            # no synchronize at the end.
            sync = h.synchronize_all_streams
            issue = host_overhead({"one": (lambda: seq1(0), sync), "four": (lambda: seq4(0), sync)},
                                  calls=REPS, warmup=WARMUP, rounds=REPS)
            host = {k: derive(v, lambda u: u / STEPS) for k, v in issue.items()}
            # Device time with the host far ahead: queued work on group 0 covers
            # twice the slowest issue seen, plus a margin.
            hold_ms = 2 * max(v["max"] for v in host.values()) * STEPS / 1e3 + 0.5
            dev = {k: per_step_us(v) for k, v in
                   device_ahead(timer, hold, hold_ms, {"one": seq1, "four": seq4}).items()}

            # Under capture: every sequence captured once, its replays timed.
            dg_wide = h.create_from_numpy(np.concatenate(dg_h, axis=1))
            dw_wide = h.zeros((hid, 4 * hid))
            cap1, cap4 = our_captured(h, seq1), our_captured(h, seq4)
            ccases = {"one": (timer, cap1), "four": (timer, cap4),
                      "wide": (timer, our_captured(h, wide_sequence(h, x, dg_wide, dw_wide)))}
            if t is not None:
                tcap1, tcap4 = torch_graphed(t, tseq1), torch_graphed(t, tseq4)
                ccases["torch1"], ccases["torch4"] = (tt, tcap1), (tt, tcap4)
            cus = {k: per_step_us(v) for k, v in interleaved(ccases, REPS, WARMUP).items()}

            dw_of = {"ours 1 group": ours_dw(h, dw, seq1), "ours 4 groups": ours_dw(h, dw, seq4),
                     "ours 1 group captured": ours_dw(h, dw, cap1),
                     "ours 4 groups captured": ours_dw(h, dw, cap4)}
            if t is not None:
                dw_of["torch 1 stream"] = torch_dw(t, tw, tseq1)
                dw_of["torch 4 streams"] = torch_dw(t, tw, tseq4)
                dw_of["torch 1 stream graphed"] = torch_dw(t, tw, tcap1)
                dw_of["torch 4 streams graphed"] = torch_dw(t, tw, tcap4)
            errors = check_dw(dw_of, x_h, dg_h)
            what = f"dW_k = {STEPS} x.T dGate_k, batch {b}, hidden {hid}"
            checks.append(dict(what=what, errors=errors, tol=TOL,
                               ok=check_line(what, errors, TOL)))

            speed = med(us["one"]) / med(us["four"])
            bound = "host" if med(host["one"]) > med(dev["one"]) else "GPU"
            t1, t4 = us.get("torch1"), us.get("torch4")
            nan = float("nan")
            table.append([b, hid, med(us["one"]), med(us["four"]), speed,
                          med(t1) if t1 else nan, med(t4) if t4 else nan,
                          med(t1) / med(t4) if t1 else nan,
                          med(host["one"]), med(dev["one"]), med(host["four"]),
                          med(dev["four"]), bound,
                          "yes" if speed >= 1 / 1.05 else "NO",
                          "yes" if speed >= 1.3 else "no"])
            c_speed = med(cus["one"]) / med(cus["four"])
            gain = med(cus["one"]) / med(cus["wide"])
            ct1, ct4 = cus.get("torch1"), cus.get("torch4")
            ctable.append([b, hid, med(cus["one"]), med(cus["four"]), c_speed,
                           med(cus["wide"]), gain, med(ct1) if ct1 else nan,
                           med(ct4) if ct4 else nan, "yes" if gain > IDLE else "no",
                           "yes" if c_speed >= 1 / CAPTURED_SLOWER else "NO",
                           ("yes" if c_speed >= 1.3 else "NO") if gain > IDLE else "-"])
            rows.append(dict(batch=b, hidden=hid, one_group_us=us["one"],
                             four_groups_us=us["four"], speedup=speed,
                             host_us_per_step=host["one"], host_us_per_step_four=host["four"],
                             device_us_per_step=dev["one"], device_us_per_step_four=dev["four"],
                             hold_ms=hold_ms, bound=bound,
                             torch_one_stream_us=t1, torch_four_streams_us=t4,
                             one_group_captured_us=cus["one"],
                             four_groups_captured_us=cus["four"], wide_captured_us=cus["wide"],
                             speedup_captured=c_speed, idle_gain=gain, partly_idle=gain > IDLE,
                             torch_graphed_one_us=ct1, torch_graphed_four_us=ct4))
    print(f"\nLSTM backward pattern: 4 x dot_add_mm per step (us per step, median of {REPS} "
          f"samples); GPU {gpu_name()}.  Host issue: no final synchronize; device: with the "
          f"host far ahead; the loop is host-bound where host issue > device")
    print_table(["batch", "hidden", "1 group", "4 groups", "speedup", "torch 1 stream",
                 "torch 4 streams", "torch speedup", "host issue (1 group)",
                 "device (1 group)", "host issue (4 groups)", "device (4 groups)",
                 "1 group is", "not >5% slower", ">=1.3x"],
                table)
    print(f"\nThe same sequences captured as graphs and replayed (us per step, median of "
          f"{REPS} replays).  Wide: one gemm of 4x the output per step; idle gain: 1 group / "
          f"wide, what filling the GPU can win (partly idle where > {IDLE})")
    print_table(["batch", "hidden", "1 group", "4 groups", "speedup", "wide gemm", "idle gain",
                 "torch 1 stream", "torch 4 streams", "partly idle",
                 f"not >{CAPTURED_SLOWER - 1:.0%} slower", ">=1.3x (partly idle)"], ctable)
    results = {"rows": rows, "checks": checks}
    if args.save:
        run.save(results)
    return 0 if all(c["ok"] for c in checks) else 1
