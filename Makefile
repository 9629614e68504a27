# `make lab`: set up .venv and open JupyterLab on the notebooks.  `make test`: set up and run every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: lab test demo bench setup clean notebooks restore

setup: $(STAMP)

# Set PIP_EXTRA to pip options, e.g. PyTorch's CPU-only index (README: "A CPU-only PyTorch on Linux").
PIP_EXTRA ?=
# JupyterLab settings for this venv: no news pop-up, no update checks, widget state saved with the notebook.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json

$(STAMP): pyproject.toml notebooks/jupyterlab-settings.json
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install $(PIP_EXTRA) -e ".[test,bench]"
	mkdir -p $(dir $(LAB_SETTINGS)) && cp notebooks/jupyterlab-settings.json $(LAB_SETTINGS)
	touch $(STAMP)

# kvlib.tools.lab adds the classroom CSS (presentation-mode text sizes, fonts for rare ideographs) and,
# where one runs as root (containers, CI machines), --allow-root.
lab: $(STAMP)
	$(BIN)/python -m kvlib.tools.lab notebooks/

# The unit tests first, spread over every core (pytest-xdist); then the notebooks and the browser test,
# one at a time, so that their timing cells and widget latencies have the machine to themselves.
# The unit tests load only the plugin they use (xdist): nbval's Jupyter imports, and the rewriting of
# hypothesis that its plugin brings, cost every process seconds. So they take pyproject's addopts
# without nbval's options.
UNIT_ARGS := --disable-plugin-autoload -p xdist.plugin -o "addopts=-ra --import-mode=importlib"
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist worksteal $(UNIT_ARGS) tests --ignore=tests/test_browser.py $(PYTEST_ARGS)
	$(BIN)/python -m pytest notebooks tests/test_browser.py $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/python -m kvlib demo

bench: $(STAMP)
	$(BIN)/python -m kvlib bench

clean:
	rm -rf $(VENV) .pytest_cache

# Re-execute every notebook in place (after retraining or a library change), then check them.
notebooks: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace notebooks/0*.ipynb

# After class: the committed notebooks back (Run All and autosave rewrite their outputs).
restore:
	git checkout -- notebooks/
