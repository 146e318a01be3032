# athanor's two commands: `make demo` (install + main job) and `make test` (install test deps + tests).
# Each creates .venv if missing. On a machine without CUDA, PyTorch is installed as the CPU build
# torch==2.13.0 *before* athanor, so the `torch>=2.11` range in pyproject.toml installs nothing more
# (a bare range would pull a multi-GB CUDA build).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_CPU := torch==2.13.0
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
PYTEST_ARGS ?=

.PHONY: demo test test-slow install install-test lint gpu-wheels gpu-test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@if [ -z "$(HAS_CUDA)" ]; then $(BIN)/python -m pip install -q $(TORCH_CPU); fi
	$(BIN)/python -m pip install -q -e .
	@touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The main job: compile the embedded model for the built-in chat traffic on this machine in 8 minutes of wall time
# (confirmation included), then print the leaderboard and the verified speedup (run directory: runs/demo). Where
# this machine's record says confirming SmolLM2 leaves 8 minutes too little search, the budget is raised to the
# smallest that works rather than the demo refused (--stretch-budget).
demo: $(VENV)/.installed
	@echo "make demo: about 9 minutes (an 8-minute compile budget, plus installing and loading; more on a machine whose record says confirming takes longer)"
	$(BIN)/athanor generate --model smollm2-135m --chat --prompt "What is the capital of France?" --max-new-tokens 32
	rm -rf runs/demo
	@# Exit status 1 means "no verified winner this time": a result of the job, reported above, not a failure.
	$(BIN)/athanor compile --model smollm2-135m --traffic preset:chat --budget 8m --stretch-budget --out runs/demo || [ $$? -eq 1 ]

# Two passes: the tests that judge speed (marker `timing`: the evaluator's verdicts, the compile loop) alone, so
# nothing else competes for the cores they time on; the rest first, one worker per core, one intra-op thread each
# (test modules stay whole on a worker: their module fixtures load once). Both run; either failing fails (a pass
# that PYTEST_ARGS leaves empty, pytest's status 5, does not). `test` is the default tier (tests/unit less the tests
# marked `slow`, at most 6 minutes on 2 cores); `test-slow` the rest, in the same two passes: the long end-to-end
# runs (tests/slow: whole sessions over wall-clock budgets, the watch, the benchmarks, exhaustive equivalence
# checks) and the exhaustive variants in tests/unit (marked `slow`) of cases the default tier keeps one of.
TEST_TWO_PASSES = status=0; \
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(1) -q -m "not timing$(2)" -n auto --dist loadfile $(PYTEST_ARGS) \
	  || { s=$$?; [ $$s -eq 5 ] || status=$$s; }; \
	$(BIN)/python -m pytest $(1) -q -m "timing$(2)" $(PYTEST_ARGS) || { s=$$?; [ $$s -eq 5 ] || status=$$s; }; \
	exit $$status

test: $(VENV)/.installed-test
	@$(call TEST_TWO_PASSES,tests/unit, and not slow)

test-slow: $(VENV)/.installed-test
	@$(call TEST_TWO_PASSES,tests/slow tests/unit, and slow)

# ruff, mypy, and the history check (no commit name or bench/results path in src/); all three run, any
# failing fails.
lint: $(VENV)/.installed-test
	@status=0; \
	$(BIN)/ruff check src tests bench scripts || status=1; \
	$(BIN)/mypy || status=1; \
	$(BIN)/python scripts/check_history.py src || status=1; \
	exit $$status

# --- the lent GPU machine (Python 3.12, torch 2.11, Triton 3.6, no network) ----------------------
# Here: gather the wheels that image lacks into .whl/ (git-ignored; pass it in the device call's carry).
gpu-wheels:
	bash scripts/gpu_wheels.sh

# There: install those wheels beside the image's own packages and run the GPU tests.
gpu-test:
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/athanor-site .whl/*.whl
	PYTHONPATH=$(CURDIR)/src:/tmp/athanor-site python3 -m pytest tests/gpu -q -m gpu -p no:cacheprovider $(PYTEST_ARGS)
