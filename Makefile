# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# PyTorch's CPU build (a local file on these machines) and Triton, whose interpreter runs our
# generated kernels on the CPU in the tests.
TORCH  ?= torch==2.13.0
TRITON ?= triton==3.9.0

.PHONY: demo test lint typecheck format docs install clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)" "$(TRITON)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test,lint,graphviz,docs]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/opgraph demo

# the fuzzer's two shards run after the rest, alone, side by side: their floor of graphs per CPU-second
# measures the fuzzer, not the tests beside it (in one run with the rest a shard fell to 234 of 250)
# One BLAS/OpenMP thread per worker: two workers already take both cores, and more threads spin-wait
# against each other (example 11 took 200 s of CPU time instead of 20 so).
FUZZ = tests/fuzz/test_fuzz.py::test_random_graphs_match_the_reference
ONE_THREAD = OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
test: lint
	$(ONE_THREAD) $(PY) -m pytest -n 2 -q --deselect $(FUZZ)
	$(ONE_THREAD) $(PY) -m pytest -n 2 -q $(FUZZ)

# ruff (pyflakes, import order, bugbear, pyupgrade, blind except, complexity), the formatting (ruff format
# --check), mypy and the layering test
# over the package (config: [tool.ruff] and [tool.mypy] in pyproject.toml)
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check opgraph
	$(VENV)/bin/ruff format --check opgraph tests examples bench scripts
	$(PY) -m mypy opgraph
	$(PY) -m pytest -q tests/test_layers.py

# mypy alone over the package (config: [tool.mypy] in pyproject.toml); `lint` runs it too
typecheck: $(VENV)/.installed
	$(PY) -m mypy opgraph

# the one formatter: ruff format, Black's style at 120 columns ([tool.ruff.format] in pyproject.toml)
format: $(VENV)/.installed
	$(VENV)/bin/ruff format opgraph tests examples bench scripts

# the user guide (docs/, mkdocs.yml) into site/; every warning is an error
docs: $(VENV)/.installed
	$(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build site *.egg-info
