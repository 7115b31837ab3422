"""Sphinx configuration for streamhandlers (built by ``make docs`` with -W)."""
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.abspath(".."))  # import handlers/, layers/, benchmarks/ from the repo

from benchmarks import report  # noqa: E402

project = "streamhandlers"
author = "the streamhandlers developers"
release = "0.1.0"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
# The GPU modules document without a GPU or these packages installed.
autodoc_mock_imports = ["pycuda", "skcuda", "nvmath"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True   # dtype=np.float32, not <class 'numpy.float32'>
# Show the names of the aliases in signatures, not what they stand for.
autodoc_type_aliases = {"Array": "handlers.base.Array", "Shape": "handlers.base.Shape",
                        "DTypeLike": "numpy.typing.DTypeLike"}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

exclude_patterns = ["_build", "_generated"]
html_theme = "alabaster"
html_theme_options = {"page_width": "1160px", "sidebar_width": "230px"}

# The benchmark page's tables come from the committed benchmarks/results/*.json,
# rebuilt on every docs build (no GPU and no matplotlib needed: the PNG plots,
# made by `python -m benchmarks report`, are copied).
report.write_docs(Path(__file__).with_name("_generated"))
