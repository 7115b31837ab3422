"""The README's Python example must run (on NumpyHandler, and on the GPU where there is
one), and its benchmark sentences must be the report's headline of the committed runs."""
import re
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.rst"


def python_blocks(text):
    """Return the bodies of the ``.. code-block:: python`` directives in ``text``."""
    blocks = []
    for match in re.finditer(r"^\.\. code-block:: python[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n)+)",
                             text, re.MULTILINE):
        blocks.append(textwrap.dedent(match.group(1)))
    return blocks


def test_readme_example_runs(capsys):
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.rst has no '.. code-block:: python' example"
    namespace = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    assert "NumpyHandler ok" in capsys.readouterr().out


def test_readme_quotes_the_benchmark_headline():
    """README.rst quotes the benchmark report's headline sentences verbatim:
    medians across the committed runs with their ranges, never a best run."""
    from benchmarks import report
    from benchmarks import runs as saved
    from benchmarks.common import RUNS_DIR

    chosen = saved.choose(saved.load(RUNS_DIR))
    if not chosen:
        pytest.skip("no committed benchmark runs to quote")
    text = " ".join(README.read_text(encoding="utf-8").split())
    missing = [line for line in report.headline(chosen) if " ".join(line.split()) not in text]
    assert not missing, "README.rst does not quote these headline sentences:\n" + "\n".join(
        missing)
