"""Sphinx configuration for streamhandlers (built by ``make docs`` with -W)."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # import handlers/ and layers/ from the repo

project = "streamhandlers"
author = "the streamhandlers developers"
release = "0.1.0"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
# The GPU modules document without a GPU or these packages installed.
autodoc_mock_imports = ["pycuda", "skcuda", "nvmath"]
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

exclude_patterns = ["_build"]
html_theme = "alabaster"
