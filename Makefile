# The short forms of run.py's commands (run.py is the same on Linux, macOS and Windows, without make):
# `make lab`: set up .venv and open JupyterLab on the notebooks.  `make test`: set up and run every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)

.PHONY: lab test setup demo bench doctor notebooks restore wheel clean

lab test setup demo bench doctor notebooks restore wheel clean:
	$(PYTHON) run.py $@ $(PYTEST_ARGS)
