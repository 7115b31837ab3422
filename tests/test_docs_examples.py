"""Every Python example in docs/*.rst runs (README.rst: see test_readme.py).

The ``.. code-block:: python`` blocks of one page share a namespace and run in
order, as a reader would run them.  A block whose first line is ``# gpu-only``
runs only where a ``PyCudaHandler`` can be constructed.  The examples use
NumpyHandler and small sizes, so this stays fast.
"""
import functools
from pathlib import Path

import numpy as np
import pytest

from handlers.testing import CONFIGS as HANDLER_CONFIGS
from test_readme import python_blocks

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.rst"))
GPU_ONLY = "# gpu-only"


@functools.lru_cache(maxsize=None)
def gpu_reason():
    """None if a PyCudaHandler can be constructed here, else why not."""
    try:
        from handlers import PyCudaHandler
        PyCudaHandler(np.float32)
    except (ImportError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def test_docs_have_examples():
    assert PAGES, f"no .rst pages in {DOCS}"
    pages = [p for p in PAGES if python_blocks((DOCS / p).read_text(encoding="utf-8"))]
    assert len(pages) >= 6, pages


def run_blocks(page, with_gpu):
    """Run the page's Python blocks in order in one namespace; gpu-only blocks
    only if ``with_gpu``.  Returns the number of blocks run."""
    blocks = python_blocks((DOCS / page).read_text(encoding="utf-8"))
    namespace = {"__name__": f"docs.{page}"}
    ran = 0
    for i, block in enumerate(blocks):
        if is_gpu_only(block) and not with_gpu:
            continue
        # One code object per block, named after the page and the block, so a
        # traceback points at the example that failed.
        exec(compile(block, f"{DOCS / page} (python block {i + 1})", "exec"), namespace)
        ran += 1
    return ran


def is_gpu_only(block):
    return block.lstrip().startswith(GPU_ONLY)


def pages_with(gpu):
    return [p for p in PAGES
            if any(is_gpu_only(b) == gpu
                   for b in python_blocks((DOCS / p).read_text(encoding="utf-8")))]


@pytest.mark.parametrize("page", pages_with(gpu=False))
def test_page_examples_run(page, capsys):
    """The blocks that run anywhere, on NumpyHandler."""
    assert run_blocks(page, with_gpu=False)
    capsys.readouterr()


@pytest.mark.parametrize("page", pages_with(gpu=True))
def test_page_gpu_examples_run(page, capsys):
    """Every block of the page, the gpu-only ones included, where there is a GPU."""
    reason = gpu_reason()
    if reason:
        pytest.skip(f"{page}: gpu-only examples need a PyCudaHandler ({reason})")
    assert run_blocks(page, with_gpu=True) > 0
    capsys.readouterr()


def test_gpu_only_marker_is_the_first_line():
    """A misspelt or misplaced marker would make a GPU block fail on the CPU."""
    for page in PAGES:
        for block in python_blocks((DOCS / page).read_text(encoding="utf-8")):
            lines = [ln.strip() for ln in block.splitlines() if ln.strip()]
            marks = [ln for ln in lines if "gpu-only" in ln]
            assert not marks or lines[0] == GPU_ONLY, (page, marks)


def test_handler_ids_in_the_tutorial_match_conftest():
    text = (DOCS / "tutorial_handlers.rst").read_text(encoding="utf-8")
    for hid in HANDLER_CONFIGS:
        assert f"``{hid}``" in text, f"tutorial_handlers.rst does not list handler id {hid}"
