"""Examples, run as ``python -m examples.<name>``."""
