# Two entry points, each doing its own setup on a fresh machine:
#   make demo   the main job on the embedded default (CPU, the real 0.5B model, no GitHub token)
#   make test   lint, import contracts and the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
NPROC := $(shell nproc 2>/dev/null || echo 2)
DEMO_MODEL ?= qwen2.5-coder-0.5b
# llama-cpp-python (the reference) ships only an sdist: build it on every core, skip the multimodal
# library, and let pip's wheel cache keep the result so that only a fresh machine pays for it.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(NPROC)
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test setup setup-dev models lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is installed first and pinned: 2.13.0 is the CPU build on disk; a looser pin pulls CUDA.
$(VENV)/.setup-base: pyproject.toml | $(BIN)/python
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[engine,bot]'
	touch $@

$(VENV)/.setup-dev: $(VENV)/.setup-base pyproject.toml
	@echo "installing the reference (llama-cpp-python builds from source once, then comes from pip's cache)"
	$(PIP) install -e '.[engine,bot,reference,dev]'
	touch $@

setup: $(VENV)/.setup-base
setup-dev: $(VENV)/.setup-dev

models: setup
	$(BIN)/python -m engine.models fetch $(DEMO_MODEL)

demo: setup models
	$(BIN)/python -m engine generate --model $(DEMO_MODEL) --chat --max-new 64 \
	  --prompt "Write a Python function that checks whether a string is a palindrome."
	$(BIN)/python -m engine bench --model $(DEMO_MODEL) --ctx 128 --gen 16

lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: setup-dev
	$(BIN)/python -m engine.models fetch $(DEMO_MODEL) qwen2.5-coder-1.5b
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
