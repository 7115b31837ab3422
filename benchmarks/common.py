"""Helpers shared by the benchmark suites: timing, tables, JSON results."""
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

RESULTS_DIR = Path(__file__).with_name("results")


def median_times(runs, iters, repeats=3):
    """Time each callable of ``runs``: warm up with ``run(1)``, then return the
    median wall time in seconds (``time.perf_counter``) of ``repeats`` calls of
    ``run(iters)``, one list entry per run.  The repeats are interleaved across
    the runs so that a slow spell of the machine does not favour one of them."""
    for run in runs:
        run(1)
    times = [[] for _ in runs]
    for _ in range(repeats):
        for run, t in zip(runs, times):
            t0 = time.perf_counter()
            run(iters)
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def print_table(headers, rows):
    """Print ``rows`` (sequences of values) under ``headers`` in aligned columns.

    Floats are shown with 4 significant digits; text is left-aligned and
    numbers right-aligned.
    """
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    print(line([str(h) for h in headers]))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print(line(r))


def cpu_name():
    """The CPU model from /proc/cpuinfo where there is one, else platform's guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name():
    """Name of CUDA device 0 through pycuda, or None without pycuda or a GPU."""
    try:
        import pycuda.driver as drv
    except ImportError:
        return None
    try:
        drv.init()
        return drv.Device(0).name()
    except drv.Error:  # no driver or no device
        return None


def machine_info():
    """What a result depends on: platform, CPU, NumPy, date and the GPU if any."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "gpu": gpu_name(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def result_name(suite, machine):
    """``<suite>-<machine>`` with every non-alphanumeric character of the
    machine name (``"gpu"`` where there is none) replaced by ``-``: the file
    name, without ``.json``, of a suite's saved results."""
    return f"{suite}-" + "".join(c if c.isalnum() else "-" for c in (machine or "gpu"))


def save_results(name, results):
    """Write ``results`` with the machine info to benchmarks/results/<name>.json
    and return the path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"machine": machine_info(), "results": results}
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return path
