"""The README's Python example must run (on NumpyHandler, and on the GPU where there is one)."""
import re
import textwrap
from pathlib import Path

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
