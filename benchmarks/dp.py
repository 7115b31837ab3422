"""``python -m benchmarks dp``: data-parallel training on the GPUs of one machine.

Run on two H200s of one machine (``benchmarks/results/runs/dp-*``).

Models, float32 (TF32 off), SGD with momentum, softmax cross-entropy:

* MLP 4096-4096-4096-4096-4096-10 (ReLU), global batch 4096: compute-bound;
* LSTM T=32, F=256, H=1024, its last hidden state into a 1024-10 layer,
  global batch 512.

Every figure comes from MPI jobs that this suite launches itself (``mpirun
-n 1`` and ``-n 2`` of ``python -m benchmarks.dp --worker ...``, one process
per GPU, the device chosen by local rank); rank 0 writes what the job
measured to a file the suite reads.

* samples/s: the global batch over the time of one training step (forward,
  backward, the gradients all-reduced in 25 MiB buckets while backward runs,
  the SGD update), on each rank its shard of the batch, resident on the
  device.  Ours: the step of ``layers.data_parallel.DataParallel`` captured
  once and replayed (as ``Trainer`` runs it), K replays between CUDA events
  on stream group 0; the slowest rank's median over ``--reps`` samples.
  Targets: 2 GPUs >= 1.85x 1 GPU for each model, and ours on 2 GPUs >= 1.0x
  PyTorch DDP on 2 GPUs.
* The peer, PyTorch DDP: ``DistributedDataParallel`` (nccl backend, its
  default 25 MiB buckets, ``gradient_as_bucket_view``) of the same model
  (``nn.Sequential`` of ``Linear`` and ``ReLU``; ``nn.LSTM`` (cuDNN) and a
  ``Linear``), the same global batch, eager steps (DDP's documented use),
  fused SGD; launched the same way, with ``MASTER_ADDR``/``MASTER_PORT`` set
  by this suite and ``RANK``/``WORLD_SIZE`` taken from MPI.
* All-reduce bus bandwidth, ``2 (n-1)/n x bytes / time``, of the MLP's flat
  gradient buffer on 2 GPUs: through our ``NcclGroup`` (the whole buffer in
  one call, and in the step's buckets), beside NCCL's own: its
  ``ncclAllReduce`` through nccl4py's binding, on a raw device buffer of the
  same size, with nothing of ours around it.
* Check: one step of the 2-GPU job gives the parameters of one step of the
  1-GPU job, from the same parameters on the same global batch (a sample of
  10,000 elements, relative error <= 1e-4), and both ranks hold the same.

Without two GPUs, pycuda, mpi4py or an ``mpirun`` this prints why it skipped
and returns 0.  ``--small`` shrinks the models (a smoke run); ``--mpirun``
names the launcher; ``--save`` writes one run (``benchmarks/results/runs/``).
"""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import (
    Run,
    check_line,
    finish,
    gpu_name,
    print_table,
    spread,
    suite_parser,
)
from benchmarks.train import LR, MOMENTUM, torch_sgd

F32 = np.float32
MODELS = {   # name: (full, small)
    "mlp": ({"sizes": (4096, 4096, 4096, 4096, 4096, 10), "batch": 4096},
            {"sizes": (64, 128, 128, 10), "batch": 64}),
    "lstm": ({"T": 32, "F": 256, "H": 1024, "classes": 10, "batch": 512},
             {"T": 4, "F": 16, "H": 32, "classes": 10, "batch": 16}),
}
SCALING_TARGET = 1.85    # 2 GPUs / 1 GPU, samples per second
PEER_TARGET = 1.0        # ours on 2 GPUs / PyTorch DDP on 2 GPUs
CHECK_TOL = 1e-4         # 1 GPU against 2 GPUs, float32, after one step
SAMPLE = 10_000          # parameters compared by the check
INNER = 5                # steps (replays) between two events
ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the models
def batch(model, cfg, rank, size):
    """This rank's shard of the global batch (the same global batch on every
    job: a fixed seed), as float64 host arrays (x, labels (n, 1))."""
    from layers.data_parallel import shard_bounds
    rng = np.random.default_rng(1)
    n = cfg["batch"]
    if model == "mlp":
        x = rng.standard_normal((n, cfg["sizes"][0]))
        classes = cfg["sizes"][-1]
    else:
        x = rng.standard_normal((cfg["T"], n, cfg["F"]))
        classes = cfg["classes"]
    y = rng.integers(0, classes, (n, 1)).astype(np.float64)
    lo, hi = shard_bounds(n, rank, size)
    return (x[lo:hi] if model == "mlp" else x[:, lo:hi]), y[lo:hi]


def our_net(h, model, cfg):
    """The model as a ``Sequential`` on ``h`` (seeded: the same on every job)."""
    from layers import LSTM, FullyConnected, ReLU, Sequential, SoftmaxCrossEntropy
    if model == "mlp":
        s, layers = cfg["sizes"], []
        for k in range(len(s) - 1):
            layers += [FullyConnected(s[k], s[k + 1]), ReLU()]
        layers.pop()
    else:
        layers = [LSTM(cfg["F"], cfg["H"], return_sequences=False),
                  FullyConnected(cfg["H"], cfg["classes"])]
    return Sequential(h, layers, SoftmaxCrossEntropy(), seed=0)


def torch_net(torch, model, cfg):
    """The same model in PyTorch, on the current GPU."""
    nn = torch.nn
    if model == "mlp":
        s, mods = cfg["sizes"], []
        for k in range(len(s) - 1):
            mods += [nn.Linear(s[k], s[k + 1]), nn.ReLU()]
        return nn.Sequential(*mods[:-1]).cuda()

    class LastState(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(cfg["F"], cfg["H"])
            self.fc = nn.Linear(cfg["H"], cfg["classes"])

        def forward(self, x):
            return self.fc(self.lstm(x)[0][-1])
    return LastState().cuda()


# ------------------------------------------------------------------ the workers
def slowest(group, samples):
    """The spread of the rank whose median step is slowest (host collective)."""
    spreads = group.allgather_object(spread(samples))
    return max(spreads, key=lambda s: s["median"])


def work_ours(args, cfg):
    """Time our data-parallel step on this job's ranks; returns rank 0's report."""
    from handlers import PyCudaHandler
    from handlers.process_group import process_group
    from layers import SGD
    from layers.data_parallel import DataParallel
    world = process_group()
    h = PyCudaHandler(F32, device=world.local_rank, num_stream_groups=5)
    group = process_group(h)
    net = our_net(h, args.model, cfg)
    opt = SGD(net.parameters, lr=LR, momentum=MOMENTUM)
    dp = DataParallel(net)
    dp.set_batch(cfg["batch"])
    x, y = batch(args.model, cfg, group.rank, group.size)
    xb, yb = h.create_from_numpy(x), h.create_from_numpy(y)

    def step():
        dp.train_step(xb, yb)
        opt.step()

    step()                                  # the check step, eager
    flat = h.get_numpy_copy(net.params)
    sample = flat[::max(1, flat.size // SAMPLE)].astype(np.float64)
    same = len({s.tobytes() for s in group.allgather_object(sample)}) == 1
    graph = h.capture(step)
    from handlers.cuda import kernel_loader
    ext = kernel_loader.require()
    start, end = ext.timing_event_new(), ext.timing_event_new()
    for _ in range(3):
        graph.replay()
    samples = []
    for _ in range(args.reps):
        ext.record(start, h.stream.handle)
        for _ in range(INNER):
            graph.replay()
        ext.record(end, h.stream.handle)
        ext.event_sync(end)
        samples.append(ext.event_elapsed(start, end) / INNER)
    ms = slowest(group, samples)
    return {"ms": ms, "samples_per_s": cfg["batch"] / (ms["median"] / 1e3),
            "buckets": len(dp.buckets), "sample": sample.tolist(), "same_on_ranks": same}


def work_torch(args, cfg):
    """Time PyTorch DDP's step on this job's ranks; returns rank 0's report."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from handlers.process_group import process_group
    group = process_group()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.set_device(group.local_rank)
    os.environ.update(RANK=str(group.rank), WORLD_SIZE=str(group.size),
                      LOCAL_RANK=str(group.local_rank))
    dist.init_process_group("nccl", rank=group.rank, world_size=group.size)
    model = torch_net(torch, args.model, cfg)
    ddp = DistributedDataParallel(model, device_ids=[group.local_rank],
                                  gradient_as_bucket_view=True)
    opt = torch_sgd(torch, ddp.parameters())
    x, y = batch(args.model, cfg, group.rank, group.size)
    xt = torch.tensor(x, dtype=torch.float32, device="cuda")
    yt = torch.tensor(y[:, 0], dtype=torch.long, device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(xt), yt).backward()
        opt.step()

    for _ in range(3):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(args.reps):
        start.record()
        for _ in range(INNER):
            step()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / INNER)
    ms = slowest(group, samples)
    dist.destroy_process_group()
    return {"ms": ms, "samples_per_s": cfg["batch"] / (ms["median"] / 1e3)}


def work_bandwidth(args, cfg):
    """Bus bandwidth of all-reduces of the MLP's gradient buffer: ours (one
    call, the step's buckets) and NCCL's own on a raw buffer of the size."""
    import pycuda.driver as drv
    from nccl.bindings import nccl as bindings

    from benchmarks.gpu import EventTimer, interleaved
    from handlers import PyCudaHandler
    from handlers.cuda.nccl import NCCL_SUM, NCCL_TYPES
    from handlers.process_group import process_group
    from layers.data_parallel import DataParallel
    world = process_group()
    h = PyCudaHandler(F32, device=world.local_rank, num_stream_groups=5)
    group = process_group(h)
    net = our_net(h, "mlp", cfg)
    dp = DataParallel(net)
    c = h.with_streams(4)
    grads = net.grads
    raw_memory = drv.mem_alloc(grads.nbytes)
    raw, comm = int(raw_memory), group.communicator
    timer = EventTimer("pycuda", stream=c.stream)
    cases = {
        "ours, one call": (timer, lambda i: group.allreduce(c, grads)),
        f"ours, {len(dp.buckets)} buckets": (
            timer, lambda i: [group.allreduce(c, b) for b in dp.buckets]),
        "NCCL (its all_reduce binding, raw buffer)": (
            timer, lambda i: bindings.all_reduce(raw, raw, grads.size, NCCL_TYPES["float32"],
                                                 NCCL_SUM, comm._comm, c.stream.handle)),
    }
    times = interleaved(cases, reps=args.reps, warmup=3, inner=INNER)
    n = group.size
    out = {}
    for label, sp in times.items():
        worst = slowest(group, [sp["median"]])["median"]
        out[label] = {"ms": sp, "slowest_median_ms": worst,
                      "bus_gb_s": 2 * (n - 1) / n * grads.nbytes / (worst / 1e3) / 1e9}
    return {"bytes": int(grads.nbytes), "ranks": n, "paths": out}


WORKERS = {"ours": work_ours, "shard": work_ours, "torch": work_torch,
           "bandwidth": work_bandwidth}


def worker(args):
    """One rank of a job (``--worker``): measure, and on rank 0 write the
    report to ``--out``."""
    from handlers.process_group import process_group
    cfg = MODELS[args.model][1 if args.small else 0]
    if args.worker == "shard":   # one GPU on one rank's shard of the global batch
        cfg = dict(cfg, batch=cfg["batch"] // 2)
    report = WORKERS[args.worker](args, cfg)
    if process_group().rank == 0:
        Path(args.out).write_text(json.dumps(report), encoding="utf-8")
    return 0


# ------------------------------------------------------------------ the driver
def why_not(launcher):
    """Why this machine cannot run the suite, or None."""
    for module, what in (("pycuda", "pycuda"), ("mpi4py", "mpi4py"), ("nccl", "nccl4py")):
        if importlib.util.find_spec(module) is None:
            return f"{what} is not installed"
    if launcher is None:
        return "no mpirun or mpiexec on PATH or beside this interpreter (--mpirun)"
    try:
        import pycuda.driver as drv
        drv.init()
        count = drv.Device.count()
    except Exception as e:   # no driver, no device
        return f"no usable GPU ({type(e).__name__}: {e})"
    if count < 2:
        return f"it needs two GPUs on this machine, found {count}"
    return None


def find_launcher(given):
    """The MPI launcher: ``given``, else mpirun or mpiexec on PATH or beside
    this interpreter."""
    if given:
        return given
    for name in ("mpirun", "mpiexec"):
        here = Path(sys.executable).parent / name
        found = str(here) if here.exists() else shutil.which(name)
        if found:
            return found
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(launcher, ranks, work, model, args):
    """Run one job; returns rank 0's report, or None after printing why not."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [launcher, "-n", str(ranks), sys.executable, "-m", "benchmarks.dp",
               "--worker", work, "--model", model, "--out", str(out), "--reps", str(args.reps)]
        cmd += ["--small"] if args.small else []
        # Open MPI refuses root without these; other launchers ignore them.
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        what = f"dp: the {work} job ({model}, {ranks} GPU)"
        # A session of its own, so that a job past its time is ended whole:
        # the launcher and the ranks it started (a launcher may leave a rank
        # running when it is killed alone).
        with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) as job:
            try:
                text = job.communicate(timeout=args.job_timeout)[0]
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                print(f"{what} did not end within {args.job_timeout} s:\n"
                      + job.communicate()[0][-3000:])
                return None
        if job.returncode != 0 or not out.exists():
            print(f"{what} failed (exit {job.returncode}):\n" + text[-3000:])
            return None
        return json.loads(out.read_text(encoding="utf-8"))


def main(argv=None):
    """Run the suite (options: ``--help``); returns the exit status."""
    p = suite_parser("dp", __doc__)
    p.add_argument("--models", default="mlp,lstm", help="comma separated: mlp, lstm")
    p.add_argument("--small", action="store_true", help="small models (a smoke run)")
    p.add_argument("--reps", type=int, default=10, help="timed samples of each figure")
    p.add_argument("--mpirun", default=None, help="the MPI launcher (default: mpirun)")
    p.add_argument("--job-timeout", type=float, default=900,
                   help="seconds one job may take (default 900)")
    # a rank of a job this suite launched
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    launcher = find_launcher(args.mpirun)
    reason = why_not(launcher)
    if reason:
        print(f"dp: skipped, this suite needs two GPUs, pycuda, mpi4py, nccl4py and mpirun: "
              f"{reason}")
        return 0
    device = gpu_name()
    run = Run("dp", device, {k: v for k, v in vars(args).items() if k not in ("worker", "out")})
    has_torch = importlib.util.find_spec("torch") is not None
    print(f"data-parallel training, float32, {device} x 1 and x 2; launcher {launcher}; "
          f"peer {'PyTorch DDP' if has_torch else '(PyTorch not installed)'}")
    results, rows, checks = {"device": device, "models": {}}, [], []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        got = {(w, n): launch(launcher, n, w, model, args)
               for w in (("ours", "torch") if has_torch else ("ours",)) for n in (1, 2)}
        one, two, peer = got[("ours", 1)], got[("ours", 2)], got.get(("torch", 2))
        res = {f"{w}_{n}": r for (w, n), r in got.items()}
        if one and two:
            res["scaling"] = two["samples_per_s"] / one["samples_per_s"]
            a, b = np.array(one["sample"]), np.array(two["sample"])
            err = float(np.abs(a - b).max() / np.abs(a).max())
            checks.append({"what": f"{model}: 2 GPUs' step against 1 GPU's",
                           "errors": {"ours": err}, "tol": CHECK_TOL,
                           "ok": check_line(f"{model} one step, 2 GPUs", {"ours": err}, CHECK_TOL,
                                            against="1 GPU") and two["same_on_ranks"]})
        if two and peer:
            res["vs_ddp"] = two["samples_per_s"] / peer["samples_per_s"]
        # What compute alone allows: a 2-GPU step takes at least one GPU's
        # step on its shard (half the batch), communication free.
        shard = launch(launcher, 1, "shard", model, args)
        if one and shard:
            res["ours_shard_1"] = shard
            res["scaling_bound"] = one["ms"]["median"] / shard["ms"]["median"]
        for (w, n), r in got.items():
            if r:
                rows.append([model, "ours" if w == "ours" else "PyTorch DDP", n,
                             r["ms"]["median"], r["samples_per_s"],
                             r["samples_per_s"] / got[(w, 1)]["samples_per_s"]
                             if n == 2 and got[(w, 1)] else "",
                             res.get("vs_ddp", "") if (w, n) == ("ours", 2) else ""])
        for r in res.values():
            if isinstance(r, dict):
                r.pop("sample", None)
        results["models"][model] = res
    print()
    print_table(["model", "library", "GPUs", "step ms", "samples/s", "vs 1 GPU", "ours/DDP"],
                rows)
    for model, res in results["models"].items():
        if "scaling" in res:
            print(f"target: {model} 2 GPUs >= {SCALING_TARGET}x 1 GPU: {res['scaling']:.3f}x "
                  + ("met" if res["scaling"] >= SCALING_TARGET else "NOT met"))
        if "scaling_bound" in res:
            shard = res["ours_shard_1"]["ms"]["median"]
            print(f"  bound from compute: 1 GPU takes {shard:.3f} ms on one rank's shard (half "
                  f"the batch), so 2 GPUs can reach at most {res['scaling_bound']:.3f}x")
        if "vs_ddp" in res:
            print(f"target: {model} ours on 2 GPUs >= {PEER_TARGET}x PyTorch DDP: "
                  f"{res['vs_ddp']:.3f}x " + ("met" if res["vs_ddp"] >= PEER_TARGET else
                                               "NOT met"))
    bw = launch(launcher, 2, "bandwidth", "mlp", args)
    if bw:
        print(f"\nall-reduce of the MLP's gradient buffer ({bw['bytes'] / 1e6:.1f} MB, "
              f"{bw['ranks']} GPUs), bus bandwidth 2(n-1)/n x bytes / time:")
        nccl = bw["paths"]["NCCL (its all_reduce binding, raw buffer)"]["bus_gb_s"]
        print_table(["path", "ms", "bus GB/s", "vs NCCL"],
                    [[k, v["slowest_median_ms"], v["bus_gb_s"], v["bus_gb_s"] / nccl]
                     for k, v in bw["paths"].items()])
    results["bandwidth"] = bw
    results["checks"] = checks
    return finish(run, results, checks, args.save)


if __name__ == "__main__":
    sys.exit(main())
