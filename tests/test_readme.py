"""The README's Python examples must run (on NumpyHandler, and on the GPU where there is
one), its results table must be the report's of the committed runs, and it must link
every page of the documentation without naming a commit."""
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


def test_readme_holds_the_benchmark_table():
    """README.rst holds the report's table of results against the strongest
    peers verbatim (``benchmarks.report.headline_table``), so its numbers are
    the committed runs' and change only with them."""
    from benchmarks import report
    from benchmarks import runs as saved
    from benchmarks.common import RUNS_DIR

    chosen = saved.choose(saved.load(RUNS_DIR))
    if not chosen:
        pytest.skip("no committed benchmark runs to quote")
    table = report.headline_table(chosen)
    assert table.count("* - ") >= 5, table
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert " ".join(table.split()) in text, (
        "README.rst does not hold the report's table (python -m benchmarks report prints "
        "it):\n" + table)


def test_readme_names_no_commit():
    """A new user reads the README without meeting a commit hash: provenance
    lives in the benchmark report."""
    text = README.read_text(encoding="utf-8")
    hashes = re.findall(r"(?<![0-9a-zA-Z])[0-9a-f]{7,40}(?![0-9a-zA-Z])", text)
    assert not [x for x in hashes if re.search(r"[a-f]", x) and re.search(r"[0-9]", x)], hashes


def test_readme_links_every_page():
    """Every page of the documentation (tutorials, reference, report) is one
    link away from the README."""
    docs = README.parent / "docs"
    text = README.read_text(encoding="utf-8")
    pages = sorted(p.name for p in docs.glob("*.rst") if p.name != "index.rst")
    assert pages
    missing = [name for name in pages if f"<docs/{name}>`_" not in text]
    assert not missing, f"README.rst links none of {missing}"
