# One entry point for learners and for CI.
#   make lab                  set up .venv (first time only) and open JupyterLab on the repository,
#                             starting on the lessons; PORT=8899 and JUPYTER_ARGS="--no-browser --ip=0.0.0.0"
#                             pass through; --allow-root is added when run as root (Docker, cloud VMs)
#   make test                 set up .venv (first time only) and run every test (ARGS="-k ..." narrows it;
#                             JOBS=N parallel workers, default one per core up to 4)
#   make run LESSON=01        execute one lesson top to bottom into runs/ (SMOKE=1: tiny configuration;
#                             ARGS="--in-place" overwrites the notebook itself; see `minigrpo run -h`)
#   make grade EX=01          grade your exercise notebook (no EX: every exercise; ARGS=-v for details)
#   make exercises            regenerate exercises/ from solutions/
#   make torch TORCH_INDEX=…  reinstall torch from another index (switch CPU <-> CUDA build)
#   make site                 build the course website from the committed notebooks into site/_build/html
#
# Choosing the torch build (decide before the first command: the default CUDA build is multi-GB):
#   NVIDIA GPU, or macOS:     make lab
#   Linux or Windows, no GPU: make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Changing your mind later: `make torch TORCH_INDEX=<index>` reinstalls torch from that index
# (no TORCH_INDEX: PyPI's default build). Giving a TORCH_INDEX different from the one .venv was
# built with to any target does the same; .venv/.minigrpo-torch-index records it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
STAMP := $(VENV)/.minigrpo-installed
TORCH_STAMP := $(VENV)/.minigrpo-torch-index
TORCH_INDEX ?=
JUPYTER_ARGS ?=
# Given on the command line only (an exported PORT or ARGS from elsewhere is ignored).
PORT :=
ARGS :=
LESSON :=
EX :=
SMOKE :=
JOBS ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2); [ "$$n" -gt 4 ] && n=4; echo $$n)
# Jupyter refuses to start as root unless told it is on purpose.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)

.PHONY: setup lab test run grade exercises torch site

ifneq ($(filter run,$(MAKECMDGOALS)),)
ifeq ($(LESSON),)
$(error make run needs a lesson number, e.g. make run LESSON=01)
endif
endif

setup: $(STAMP)
ifneq ($(TORCH_INDEX),)
	@if [ "$$(cat $(TORCH_STAMP) 2>/dev/null)" != "$(TORCH_INDEX)" ]; then \
		$(MAKE) --no-print-directory torch TORCH_INDEX="$(TORCH_INDEX)"; fi
endif

# The course extra adds Jupyter, plotting, grading and test tools to the library's dependencies.
# torch is installed first, from TORCH_INDEX when given, unless .venv already has one (CI pins its own).
# An older .venv had pygame, which clashes with the pygame-ce that gymnasium[box2d] now brings.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if ! $(BIN)/python -m pip show -q torch 2>/dev/null; then \
		echo "installing torch from $(or $(TORCH_INDEX),PyPI)"; \
		$(BIN)/python -m pip install torch $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) && \
		printf '%s\n' "$(TORCH_INDEX)" > $(TORCH_STAMP); fi
	@if $(BIN)/python -m pip show -q pygame 2>/dev/null && ! $(BIN)/python -m pip show -q pygame-ce 2>/dev/null; then \
		$(BIN)/python -m pip uninstall -y -q pygame; fi
	$(BIN)/python -m pip install -e ".[course]"
	touch $(STAMP)

# Works with or without a .venv: `make torch TORCH_INDEX=...` then `make lab` is fine too.
torch:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip uninstall -y -q torch
	$(BIN)/python -m pip install torch $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	printf '%s\n' "$(TORCH_INDEX)" > $(TORCH_STAMP)
	@$(BIN)/python -c "import torch; print('torch', torch.__version__, '| CUDA available:', torch.cuda.is_available())"

# Rooted at the repository so that notebooks/, exercises/ and solutions/ are all in the file
# browser; .venv/bin first on PATH so that Jupyter's terminals and `!` commands find `minigrpo`
# (terminals open at the repository root). Terminals run your $SHELL as a plain interactive shell:
# Jupyter would otherwise start a login shell whenever its output is not a terminal, and a login
# shell's /etc/profile can reset PATH.
lab: setup
	PATH="$(BIN):$$PATH" VIRTUAL_ENV="$(abspath $(VENV))" $(BIN)/jupyter lab \
		--ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/notebooks \
		"--ServerApp.terminado_settings=shell_command=$${SHELL:-$$(command -v bash || echo /bin/sh)}" \
		$(if $(PORT),--port=$(PORT)) $(ALLOW_ROOT) $(JUPYTER_ARGS)

# Test files run in parallel, one file per worker (a notebook's cells share one kernel): JOBS workers, by default
# one per CPU core up to 4 (each loads torch). JOBS=0 runs everything in this process.
test: setup
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile $(ARGS)

run: setup
	$(BIN)/minigrpo run $(LESSON) $(if $(filter 1 yes true,$(SMOKE)),--smoke) $(ARGS)

grade: setup
	$(BIN)/minigrpo grade $(EX) $(ARGS)

exercises: setup
	$(BIN)/minigrpo make-exercises

# The course website: Jupyter Book renders the README, the lessons, their deep dives and the interview question bank
# with their committed outputs (no notebook runs) into site/_build/html. The `site` extra is installed the first time.
# Warnings are errors (-W), so a broken link or a page that does not render fails the build.
SITE_IMPORTS := import jupyter_book, playwright, importlib; importlib.import_module('sphinx-mathjax-offline')
site: setup
	@if ! $(BIN)/python -c "$(SITE_IMPORTS)" 2>/dev/null; then \
		$(BIN)/python -m pip install -e ".[site]"; fi
	$(BIN)/jupyter-book build site -W -n --keep-going
	@echo "The site is in site/_build/html: open site/_build/html/index.html in a browser."
