"""``python -m benchmarks [--runs N] [SUITE|all] [options]``; SUITE is one of SUITES below.

Each suite is a module ``benchmarks.<name>`` with ``main(argv)``; options after
the suite name go to it (``python -m benchmarks mxb --n 500``).  A suite's
``--save`` writes one run (``benchmarks/results/runs/``); ``report`` combines
the runs of the current code and plots them as PNGs in ``benchmarks/results/``.
``all`` runs every suite, then the report; ``--runs N`` repeats the suites N
times, taking them in turn (ops, streams, ..., ops, streams, ...) so that a
slow spell of the machine spreads over all of them
(``python -m benchmarks --runs 3 all --save`` is how committed results are made).
One diagnostic, not part of ``all``: ``hostcost`` splits small ops' host
time into Python and kernel launch, beside raw launch and event floors.
"""
import argparse
import importlib
import importlib.util
import sys

# all: in this order
SUITES = ("mxb", "ops", "reductions", "streams", "upload", "train", "conv", "fusion", "half",
          "gpt", "dp", "report")
TOOLS = ("hostcost",)   # diagnostics, run by name only


def written(name):
    return importlib.util.find_spec(f"benchmarks.{name}") is not None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1,
                        help="repeat the suite(s) this many times, in turn (default 1)")
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
    for run in range(args.runs):
        for name in names:
            if name == "report" and run < args.runs - 1:
                continue   # the report once, after the last round
            if len(names) > 1 or args.runs > 1:
                print(f"\n== {name} (round {run + 1} of {args.runs}) ==")
            # The report takes no suite options (--save and the like).
            options = [] if name == "report" and args.suite == "all" else args.options
            status = importlib.import_module(f"benchmarks.{name}").main(options) or status
    return status


if __name__ == "__main__":
    sys.exit(main())
