"""Helpers shared by the benchmark suites: spread, timing, tables, saved runs.

Every timed figure a suite saves is a *spread*: a dict with the samples'
count ``n``, ``median``, ``min``, quartiles ``q1``/``q3`` and ``max``
(:func:`spread`).  Ratios derived from figures are plain numbers computed
from the medians.  :func:`med` reads either form.
"""
import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

from benchmarks import provenance

RESULTS_DIR = Path(__file__).with_name("results")
#: every saved run is one JSON file here: <suite>-<machine>-<UTC stamp>.json
RUNS_DIR = RESULTS_DIR / "runs"
SPREAD_KEYS = ("n", "median", "min", "q1", "q3", "max")


# ----------------------------------------------------------------- spread
def spread(samples):
    """``{n, median, min, q1, q3, max}`` of a non-empty sequence of numbers."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("spread of no samples")
    if len(xs) == 1:
        q1 = q3 = xs[0]
    else:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return dict(n=len(xs), median=statistics.median(xs), min=xs[0], q1=q1, q3=q3, max=xs[-1])


def is_spread(x):
    """True for a dict written by :func:`spread` (or combined across runs)."""
    return isinstance(x, dict) and "median" in x and "n" in x


def derive(sp, f):
    """The spread of ``f(sample)`` for a monotonic ``f`` (bytes / time, a
    scale): ``f`` applied to each statistic, reordered where ``f`` decreases."""
    vals = sorted(f(sp[k]) for k in ("min", "q1", "median", "q3", "max"))
    return dict(n=sp["n"], min=vals[0], q1=vals[1], median=vals[2], q3=vals[3], max=vals[4])


def med(x):
    """The median of a spread, or ``x`` itself for a plain number or None."""
    return x["median"] if is_spread(x) else x


# ----------------------------------------------------------------- host timing
def median_times(runs, iters, repeats=3):
    """Time each callable of ``runs`` on the host clock: warm up with
    ``run(1)``, then return one spread of seconds per run over ``repeats``
    calls of ``run(iters)``.  The repeats are interleaved across the runs, so
    that a slow spell of the machine does not favour one of them."""
    for run in runs:
        run(1)
    times = [[] for _ in runs]
    for _ in range(repeats):
        for run, t in zip(runs, times):
            t0 = time.perf_counter()
            run(iters)
            t.append(time.perf_counter() - t0)
    return [spread(t) for t in times]


# ----------------------------------------------------------------- tables
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


def check_line(what, errors, tol, against="float64 NumPy"):
    """Print and return whether every relative error in ``errors`` (``{library:
    error}``, None where not run) against the reference ``against`` is within
    ``tol``: the correctness check a suite prints beside its timings."""
    ran = {k: v for k, v in errors.items() if v is not None}
    ok = all(v <= tol for v in ran.values())
    print(f"check {what}: " + ", ".join(f"{k} {v:.1e}" for k, v in ran.items())
          + f" (max relative error against {against}; tolerance {tol:.0e}): "
          + ("ok" if ok else "FAILED"))
    return ok


def rel_error(got, ref):
    """``max |got - ref| / max |ref|`` in float64 (0 when both are zero)."""
    import numpy as np
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    err = float(np.abs(got - ref).max()) if ref.size else 0.0
    if not np.isfinite(err):
        return float("inf")
    return err / scale if scale else err


# ----------------------------------------------------------------- saved runs
def machine_key(name):
    """A device name made safe for a file name: every non-alphanumeric
    character becomes ``-`` (``"NVIDIA H200"`` -> ``"NVIDIA-H200"``)."""
    return "".join(c if c.isalnum() else "-" for c in (name or "unknown")).strip("-")


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


class Run:
    """One run of a suite: its provenance, taken when the run starts (clocks
    before) and completed when it is saved (clocks after).

    ``Run("ops", device, options)`` prints a one-line provenance summary;
    ``run.save(results)`` writes ``benchmarks/results/runs/<suite>-<device
    key>-<UTC stamp>.json`` and returns the path.
    """

    def __init__(self, suite, device, options):
        self.suite, self.device, self.options = suite, device or "CPU", dict(options)
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.info = provenance.collect()
        print(provenance.summary(self.info))

    def save(self, results, runs_dir=None):
        """Write the run's JSON (provenance, options, results) and return its path."""
        info = dict(self.info)
        info["clocks_after"] = provenance.clocks()
        info["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds")
        runs_dir = Path(runs_dir or RUNS_DIR)
        runs_dir.mkdir(parents=True, exist_ok=True)
        stamp = self.started.strftime("%Y%m%dT%H%M%SZ")
        path = runs_dir / f"{self.suite}-{machine_key(self.device)}-{stamp}.json"
        payload = {"suite": self.suite, "device": self.device, "options": self.options,
                   "provenance": info, "results": results}
        path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        print("saved", path)
        return path



def finish(run, results, checks, save):
    """The end of a suite that checks its results: print how many of
    ``checks`` agree (naming those that failed) and, with ``save``, write the
    run.  Returns 0, the suite's exit status."""
    bad = [c["what"] for c in checks if not c["ok"]]
    print(f"\nchecks: {len(checks) - len(bad)} of {len(checks)} agree"
          + (f"; FAILED: {', '.join(bad)}" if bad else ""))
    if save:
        run.save(results)
    return 0


def suite_parser(suite, doc, save=True):
    """The argument parser of ``python -m benchmarks <suite>``: its module
    docstring as the description (kept as written) and, for the suites that
    save runs, ``--save``."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {suite}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if save:
        parser.add_argument("--save", action="store_true",
                            help="write a run under benchmarks/results/runs/")
    return parser
