# The commands README.rst gives.  PYTHON may name a virtualenv's interpreter.
PYTHON ?= python3

.PHONY: install test demo bench docs lint clean

install:
	$(PYTHON) -m pip install -q -e '.[test]'

test: install
	$(PYTHON) -m pytest -q -rs tests

# The main job: an LSTM digits classifier on the GPU if there is one, else NumPy.
demo: install
	$(PYTHON) -m pip install -q -e '.[examples]'
	$(PYTHON) -m examples.digits
	$(PYTHON) -m benchmarks mxb

bench: install
	$(PYTHON) -m benchmarks all

docs:
	$(PYTHON) -m pip install -q -e '.[docs]'
	$(PYTHON) -m sphinx -W -b html docs docs/_build/html

lint:
	$(PYTHON) -m pip install -q ruff
	$(PYTHON) -m ruff check .

clean:
	rm -rf build dist *.egg-info docs/_build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
