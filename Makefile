# The commands README.rst gives.  PYTHON may name a virtualenv's interpreter.
PYTHON ?= python3
# Extra pytest options for make test; TEST_FLAGS=-rs lists every skipped test
# with its reason (by default only the handlers that are skipped, and why).
TEST_FLAGS ?=

.PHONY: install test demo bench docs lint clean

install:
	$(PYTHON) -m pip install -q -e '.[test]'

test: install
	$(PYTHON) -m pytest -q $(TEST_FLAGS) tests

# The main job: an LSTM and a small conv net classify the 8x8 digits and a small
# GPT learns to write like Python's help topics, on the GPU if there is one, else
# NumPy.
# Then the m·x+b loop at its --quick size (seconds on a small CPU; the full size,
# about a minute there, is `python -m benchmarks mxb`, part of `make bench`).
# One editable install with what the demo needs (not install's test extras):
# each pip call costs about 7 s on a 2-core CPU, a third of the whole demo.
demo:
	$(PYTHON) -m pip install -q -e '.[examples]'
	$(PYTHON) -m examples.digits
	$(PYTHON) -m examples.conv_digits
	$(PYTHON) -m examples.gpt
	$(PYTHON) -m benchmarks mxb --quick

# Every suite, then the report: PNG plots from benchmarks/results/*.json.
bench: install
	$(PYTHON) -m pip install -q -e '.[examples]'
	$(PYTHON) -m benchmarks all

docs:
	$(PYTHON) -m pip install -q -e '.[docs]'
	$(PYTHON) -m sphinx -W -b html docs docs/_build/html

# Options on the command line: the top level of the repository holds no lint
# config.  tests/ is a source root so that its helper modules sort as first party.
RUFF_VERSION = 0.17.6
RUFF_OPTIONS = --select E,F,W,I --line-length 100 --target-version py310 \
	--config "src = ['.', 'tests']" --extend-exclude docs/_build,docs/_generated \
	--per-file-ignores "handlers/generated_ops.py:E501"

lint:
	$(PYTHON) -m pip install -q 'ruff==$(RUFF_VERSION)'
	$(PYTHON) -m ruff check $(RUFF_OPTIONS) .

clean:
	rm -rf build dist *.egg-info docs/_build docs/_generated .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
