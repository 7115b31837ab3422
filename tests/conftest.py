"""The project's tests run on the test kit it ships (``handlers.testing``):
its ``handler``, ``handler_id``, ``make_handler``, ``sibling_handler`` and
``rng`` fixtures and its ``--handler``/``--seed`` options.

Installed, streamhandlers registers the kit through its ``pytest11`` entry
point (named ``handlers.testing``, so the line below then adds nothing); from
a plain checkout (``PYTHONPATH=.``, the GPU machine) the line loads it.  What
is this project's own: the summary lines of the bad-input cases and of the
stability test.
"""
import sys
from pathlib import Path

try:
    import handlers  # noqa: F401
except ImportError:  # run as plain `pytest` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytest_plugins = ("handlers.testing",)


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    counts = {}
    for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        n = sum("test_validation.py::test_bad_input" in getattr(rep, "nodeid", "")
                for rep in tr.stats.get(outcome, []))
        if n:
            counts[outcome] = n
    if counts:
        tr.write_line("bad-input validation cases: "
                      + ", ".join(f"{v} {k}" for k, v in counts.items()))
    for outcome in ("passed", "failed"):   # resource figures of the stability test
        for rep in tr.stats.get(outcome, []):
            for key, value in getattr(rep, "user_properties", ()):
                if key == "stability" and rep.when == "call":
                    tr.write_line(f"stability {rep.nodeid.split('[')[-1].rstrip(']')}: {value}")

