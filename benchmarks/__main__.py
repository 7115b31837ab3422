"""``python -m benchmarks [mxb|ops|streams|upload|train|report|all] [suite options]``.

Each suite is a module ``benchmarks.<name>`` with ``main(argv)``; options after
the suite name go to it (``python -m benchmarks mxb --n 500``).  ``report``
plots the saved results (``benchmarks/results/*.json``, written by a suite's
``--save``) as PNGs beside them; ``all`` runs every suite, then the report.
Two diagnostics, not part of ``all``: ``sumtune`` (a sweep of ``sum_t``'s
chunking knobs) prints which settings run fastest on this GPU; ``hostcost``
splits small ops' host time into Python and kernel launch, beside raw launch
and event floors.
"""
import argparse
import importlib
import importlib.util
import sys

SUITES = ("mxb", "ops", "streams", "upload", "train", "report")   # all: in this order
TOOLS = ("sumtune", "hostcost")   # diagnostics, run by name only


def written(name):
    return importlib.util.find_spec(f"benchmarks.{name}") is not None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", nargs="?", default="all",
                        help="|".join(SUITES + ("all",) + TOOLS))
    parser.add_argument("options", nargs=argparse.REMAINDER, help="passed to the suite")
    args = parser.parse_args(argv)
    available = [s for s in SUITES if written(s)]

    if args.suite == "all":
        names = available
    elif args.suite in TOOLS:
        names = [args.suite]
    elif args.suite not in SUITES:
        print(f"benchmarks: unknown suite {args.suite!r}; choose from "
              f"{', '.join(SUITES + TOOLS)} or all", file=sys.stderr)
        return 2
    elif args.suite not in available:
        print(f"benchmarks: suite {args.suite!r} is not written yet; "
              f"available now: {', '.join(available)}", file=sys.stderr)
        return 2
    else:
        names = [args.suite]

    status = 0
    for name in names:
        if len(names) > 1:
            print(f"\n== {name} ==")
        status = importlib.import_module(f"benchmarks.{name}").main(args.options) or status
    return status


if __name__ == "__main__":
    sys.exit(main())
