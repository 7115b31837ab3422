"""What the diagnostics that time kernel variants share (``register_caps``,
``summed_rows_prefetch``): a process builds its kernels once, so each
variant runs in a process of its own (the script again, ``--run ARG``),
times the same cases on a fresh float32 ``PyCudaHandler`` and prints one
``RESULT`` line of JSON, which the parent collects."""
import json
import subprocess
import sys


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
