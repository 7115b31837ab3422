"""The saved runs of the suites: loading, choosing what to report, combining.

Each ``--save`` writes one run (``benchmarks/results/runs/*.json``, see
:class:`benchmarks.common.Run`).  What the report and the README quote for a
suite is chosen here, in one place:

* the runs that measured **the current code** (their code fingerprint equals
  the fingerprint of the code in this checkout), with the same options as the
  newest of them;
* else the runs of the newest measured code, still **current** where that
  code differs from this checkout's only in Python docstrings and comments
  (:func:`docs_only_since`: nothing a run measures), otherwise marked
  **stale** with the number of commits that have changed the measured code
  since (:func:`benchmarks.provenance.commits_since`).

The chosen runs are combined figure by figure (:func:`combine`): a figure's
value is the median across runs of each run's median, and its range across
runs (``run_min``, ``run_max``) travels with it, so a quoted number is never
the best run.
"""
import ast
import functools
import json
import statistics
from pathlib import Path

from benchmarks import provenance
from benchmarks.common import RUNS_DIR, is_spread, machine_key


def load(runs_dir=RUNS_DIR):
    """Every saved run under ``runs_dir``, oldest first; each payload as saved
    plus ``path``."""
    runs = []
    for path in sorted(Path(runs_dir).glob("*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        if "suite" not in payload or "provenance" not in payload:
            continue   # not a run file
        payload["path"] = path
        runs.append(payload)
    return sorted(runs, key=_date)


def _date(run):
    return run["provenance"].get("date") or ""


def _fingerprint(run):
    return run["provenance"].get("code_fingerprint")


def choose(runs, fingerprint=None, root=provenance.ROOT):
    """``{suite: (machine key, combined payload)}`` of what to report.

    ``fingerprint`` is the current code's (computed from ``root`` when not
    given).  The combined payload has the newest run's ``suite``, ``device``,
    ``options`` and ``provenance``; ``combined``, the chosen runs'
    results combined figure by figure (:func:`combine`); ``results``, the
    same with every figure replaced by its median (:func:`medians`), in the
    shape one run saves; ``status`` (:func:`status`) and the ``runs``."""
    if fingerprint is None:
        fingerprint = provenance.code_fingerprint(root)
    by_suite = {}
    # once per commit: the suites' runs mostly share theirs (git runs per call)
    docs_only = functools.lru_cache(maxsize=None)(lambda c: docs_only_since(c, root))
    for run in runs:
        by_suite.setdefault(run["suite"], []).append(run)
    chosen = {}
    for suite, rs in by_suite.items():
        current = [r for r in rs if _fingerprint(r) == fingerprint]
        pool = current or [r for r in rs if _fingerprint(r) == _fingerprint(rs[-1])]
        newest = pool[-1]
        prov = newest["provenance"]
        # measured at a clean commit whose code differs from this only in
        # docstrings and comments: the same measured code
        same_code = bool(current) or (prov.get("dirty") is False
                                      and docs_only(prov.get("commit")) is True)
        same = [r for r in pool if r["device"] == newest["device"]
                and r.get("options") == newest.get("options")]
        payload = {k: newest[k] for k in ("suite", "device", "options", "provenance")}
        payload["combined"] = combine([r["results"] for r in same])
        payload["results"] = medians(payload["combined"])
        payload["status"] = status(same, same_code, root, docs_only=same_code and not current)
        payload["runs"] = same
        chosen[suite] = (machine_key(newest["device"]), payload)
    return chosen


def status(runs, current, root=provenance.ROOT, docs_only=False):
    """What the reader needs to trust the chosen runs of one suite: how many,
    when, which commits, whether any was dirty, whether they measured the
    current code (``docs_only``: the same code, but for docstrings and
    comments changed since) and, if not, how many commits changed it
    since."""
    prov = [r["provenance"] for r in runs]
    commits = sorted({(p.get("commit") or "unknown")[:10] for p in prov})
    newest = prov[-1].get("commit")
    clocks = [p.get(k) or {} for p in prov for k in ("clocks_before", "clocks_after")]
    sm = sorted(int(c["clocks.sm"]) for c in clocks if str(c.get("clocks.sm", "")).isdigit())
    return {
        "runs": len(runs),
        "current": current,
        "docs_only": docs_only,
        "commits": commits,
        "dirty": [p.get("dirty") for p in prov],
        "commits_since": None if current else provenance.commits_since(newest, root),
        "first": _date(runs[0]),
        "last": _date(runs[-1]),
        "sm_clock_mhz": (sm[0], sm[-1]) if sm else None,
        "files": [r["path"].name for r in runs if "path" in r],
    }


def stale_text(st):
    """"current" or why not, in words, for a table cell or a headline."""
    if st["current"]:
        return ("current (docstrings and comments changed since)" if st.get("docs_only")
                else "current")
    since = st["commits_since"]
    if since == 0:   # same commit, but the code here differs from what was measured
        return "STALE: the measured code has changed since (not yet committed)"
    n = "an unknown number of" if since is None else str(since)
    return f"STALE: {n} commit(s) changed the measured code since"


# ------------------------------------------------------------------ combining
def combine(results):
    """Combine the ``results`` of several runs of one suite, figure by figure.

    Runs share a structure (same suite and options).  A spread becomes the
    spread of its per-run medians (``median``; ``run_min``/``run_max`` their
    range; ``runs``) keeping the pooled extremes (``min``, ``max``) and sample
    count ``n``; a plain number becomes a spread across runs in the same
    form; booleans hold only if they hold in every run; lists combine element
    by element (to the shortest); anything else is the newest run's."""
    newest = results[-1]
    if is_spread(newest):
        sps = [r for r in results if is_spread(r)]
        meds = [r["median"] for r in sps]
        return dict(n=sum(r["n"] for r in sps), median=statistics.median(meds),
                    min=min(r["min"] for r in sps), max=max(r["max"] for r in sps),
                    q1=statistics.median(r.get("q1", r["median"]) for r in sps),
                    q3=statistics.median(r.get("q3", r["median"]) for r in sps),
                    runs=len(sps), run_min=min(meds), run_max=max(meds))
    if isinstance(newest, bool):
        return all(r is True for r in results if isinstance(r, bool))
    if isinstance(newest, (int, float)):
        vals = [r for r in results if isinstance(r, (int, float)) and not isinstance(r, bool)]
        if isinstance(newest, int) and len(set(vals)) == 1:
            return newest   # a count or a size, not a measurement
        return dict(n=len(vals), median=statistics.median(vals), min=min(vals), max=max(vals),
                    runs=len(vals), run_min=min(vals), run_max=max(vals))
    if isinstance(newest, dict):
        return {k: combine([r.get(k) for r in results if isinstance(r, dict) and k in r])
                for k in newest}
    if isinstance(newest, list):
        lists = [r for r in results if isinstance(r, list)]
        n = min(len(r) for r in lists)
        return [combine([r[i] for r in lists]) for i in range(n)]
    if newest is None:
        rest = [r for r in results if r is not None]
        return combine(rest) if rest else None
    return newest


def medians(tree):
    """``tree`` with every spread replaced by its median: the numbers the
    verdicts and tables use."""
    if is_spread(tree):
        return tree["median"]
    if isinstance(tree, dict):
        return {k: medians(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [medians(v) for v in tree]
    return tree


def run_range(x):
    """``(run_min, run_max, runs)`` of a combined figure, or None."""
    if isinstance(x, dict) and "run_min" in x:
        return x["run_min"], x["run_max"], x["runs"]
    return None


#: The nodes whose first statement may be a docstring
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _code(source):
    """Python ``source`` as its syntax tree without docstrings (comments are
    not in the tree), dumped; None if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, _DOCUMENTED) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def docs_only_since(commit, root=provenance.ROOT):
    """Whether the measured code here (``provenance.code_files``) differs from
    ``commit``'s only in Python docstrings and comments: True; False where
    it differs otherwise (any change to a C or CUDA file, a file added or
    removed); None where git cannot tell (no git, an unknown commit)."""
    if not commit:
        return None
    spec = provenance.GIT_CODE_SPEC
    changed = provenance._run(["git", "diff", "--name-only", commit, "--", *spec], root)
    added = provenance._run(["git", "ls-files", "--others", "--exclude-standard", "--", *spec],
                            root)
    if changed is None or added is None:
        return None
    code = [n for n in changed.splitlines() if Path(n).suffix in provenance.CODE_SUFFIXES]
    if any(Path(n).suffix in provenance.CODE_SUFFIXES for n in added.splitlines()):
        return False
    for name in code:
        path = Path(root) / name
        before = provenance._run(["git", "show", f"{commit}:{name}"], root)
        if Path(name).suffix != ".py" or before is None or not path.is_file():
            return False
        now = _code(path.read_text(encoding="utf-8"))
        if now is None or now != _code(before):
            return False
    return True
