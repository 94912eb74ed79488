# One entry point for learners and for CI.
#   make lab            set up .venv (first time only) and open the course in JupyterLab
#   make test           set up .venv (first time only) and run every test
#   make run LESSON=01  execute one lesson top to bottom, outputs saved in place
#   make grade EX=01    grade your exercise notebook(s)
# CPU-only Linux machine? Add TORCH_INDEX=https://download.pytorch.org/whl/cpu to the first
# command to skip the multi-GB CUDA build of torch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.minigrpo-installed
TORCH_INDEX ?=

.PHONY: setup lab test run grade exercises

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install torch --index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -e .
	touch $(STAMP)

lab: setup
	$(BIN)/jupyter lab notebooks/

test: setup
	$(BIN)/python -m pytest

run: setup
	$(BIN)/minigrpo run $(LESSON)

grade: setup
	$(BIN)/minigrpo grade $(EX)

exercises: setup
	$(BIN)/minigrpo make-exercises
