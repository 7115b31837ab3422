"""Benchmarks: ``python -m benchmarks SUITE`` prints tables (see ``__main__``)."""
