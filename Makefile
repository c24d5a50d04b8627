# Two entry points, each doing its own setup on a fresh machine:
#   make demo   the main job on the embedded default (CPU, the real 0.5B model, no GitHub token)
#   make test   lint, import contracts and the test suite
# and two for the edit loop, which never build llama.cpp nor fetch a model:
#   make lint   ruff, ruff format, mypy, the import contracts and actionlint
#   make check  lint, then the unit tests on every core (what it leaves out, it says)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
NPROC := $(shell nproc 2>/dev/null || echo 2)
DEMO_MODEL ?= qwen2.5-coder-0.5b
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo demo-llama test test-clock test-setup test-models check setup setup-tools setup-dev models lint clean sandbox browser

# bubblewrap is the sandbox untrusted engine code runs in; without it `evalbot evaluate` refuses to run PR code
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  echo "installing bubblewrap"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	  $$SUDO apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO apt-get install -y -q bubblewrap >/dev/null; } || \
	  echo "warning: could not install bubblewrap; sandboxed tests will skip and evaluate will refuse PR code"; }

# the dashboard's browser tests drive Debian's chromium through playwright (no browser download)
browser: sandbox
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	  $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO apt-get install -y -q chromium >/dev/null; } || \
	  echo "warning: could not install chromium; the dashboard browser tests will skip"; }

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is installed first and pinned: 2.13.0 is the CPU build on disk; a looser pin pulls CUDA.
# evalbot (the root pyproject, which ships evalbot only) and the demo engine it judges (engine-dist/), side by side
$(VENV)/.setup-base: pyproject.toml engine-dist/pyproject.toml | $(BIN)/python
	$(PIP) install torch==2.13.0
	$(PIP) install -e ./engine-dist -e '.[bot]'
	touch $@

# The dev tools (pytest, ruff, mypy, import-linter, actionlint ...): all that lint and the unit tests need.
$(VENV)/.setup-tools: $(VENV)/.setup-base pyproject.toml
	$(PIP) install -e ./engine-dist -e '.[bot,dev]'
	touch $@

# The reference (llama-cpp-python) builds from its sdist once, on every core, with the pinned portable
# flags of evalbot/reference/build.py (the one place they live), into a wheel cached beside pip's cache.
$(VENV)/.setup-dev: $(VENV)/.setup-tools evalbot/reference/build.py
	$(BIN)/python -m evalbot.reference.build install
	touch $@

setup: $(VENV)/.setup-base sandbox
setup-tools: $(VENV)/.setup-tools
setup-dev: $(VENV)/.setup-dev sandbox

models: setup
	$(BIN)/python -m evalbot.reference.registry fetch $(DEMO_MODEL)

# The main job on the embedded default: CPU, the real 0.5B model, a local git repository, no GitHub
# token. The bot builds main and a contributor's branch from source, runs them sandboxed and
# interleaved, gates accuracy against llama.cpp, and writes the PR comment, result and receipt.
DEMO_DIR ?= .demo
demo: setup-dev models
	$(BIN)/python -m engine generate --model $(DEMO_MODEL) --chat --max-new 48 \
	  --prompt "Write a Python function that checks whether a string is a palindrome."
	bash scripts/make_demo_repo.sh $(DEMO_DIR)/repo
	@status=0; $(BIN)/evalbot evaluate --repo $(DEMO_DIR)/repo --base main --head demo-head --profile cpu \
	  --max-pairs 6 --out $(DEMO_DIR)/out || status=$$?; \
	  echo; cat $(DEMO_DIR)/out/report.md; echo; echo "evalbot evaluate exit status: $$status (0 PASS, 1 REJECT, 3 INFRA_ERROR, 4 SKIPPED, 5 INCONCLUSIVE)"; \
	  test $$status -ne 3 -a -f $(DEMO_DIR)/out/report.md

# llama.cpp, an engine nobody here wrote, judged as a contest (#38): main is the llama.cpp that the
# reference's sdist vendors, served by its own llama-server behind the harness's relay; the PR is a real
# change to its CPU decode path (the Q4_K dot product's AVX2 kernel off). The two llama-server builds are
# cached by tree in $(LLAMA_DEMO_DIR)/work; the report and the timings land in $(LLAMA_DEMO_DIR)/out.
LLAMA_DEMO_DIR ?= .demo-llama
demo-llama: setup-dev models
	rm -rf $(LLAMA_DEMO_DIR)/contest $(LLAMA_DEMO_DIR)/out && mkdir -p $(LLAMA_DEMO_DIR)
	PATH="$(abspath $(BIN)):$$PATH" bash bench/llama_contest.sh $(LLAMA_DEMO_DIR)/contest
	@status=0; start=$$(date +%s); $(BIN)/evalbot evaluate --repo $(LLAMA_DEMO_DIR)/contest --base main \
	  --head pr/q4k-no-avx2 --profile cpu --no-spec --work-dir $(LLAMA_DEMO_DIR)/work \
	  --out $(LLAMA_DEMO_DIR)/out || status=$$?; \
	  echo; cat $(LLAMA_DEMO_DIR)/out/report.md; echo; \
	  echo "evalbot evaluate exit status: $$status after $$(( $$(date +%s) - start )) s"; \
	  test $$status -ne 3 -a -f $(LLAMA_DEMO_DIR)/out/report.md

# ruff (lint and format), mypy, the import contracts and the workflows: the dev tools only, no llama.cpp
lint: setup-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/actionlint
	$(BIN)/python scripts/dead_code.py

# The suite in two parts: everything that does not time anything on every core (pytest-xdist; a module's
# tests stay on one worker, so its fixtures are built once; the heaviest modules are queued first, see
# tests/conftest.py), then the tests marked `timing` (A/B runs,
# clocks, the quiet-box guard) alone, so that no other test is the load they measure. The total time,
# setup included, is printed at the end.
PYTEST_WORKERS ?= $(NPROC)
test: test-clock
	$(MAKE) --no-print-directory -j3 test-setup
	@echo "make test: setup $$(( $$(date +%s) - $$(cat .make-test-t0) )) s"; date +%s > .make-test-t1
	$(MAKE) --no-print-directory lint
	@t2=$$(date +%s); status=0; \
	  $(BIN)/python -m pytest -q --tb=short -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not timing" --durations=20 || status=$$?; \
	  t3=$$(date +%s); \
	  if [ $$status -eq 0 ]; then $(BIN)/python -m pytest -q --tb=short -p no:xdist -m timing --durations=20 || status=$$?; fi; \
	  t4=$$(date +%s); \
	  echo "make test: lint $$((t2 - $$(cat .make-test-t1))) s, tests on $(PYTEST_WORKERS) workers $$((t3 - t2)) s," \
	    "timing tests alone $$((t4 - t3)) s; exit $$status after $$((t4 - $$(cat .make-test-t0))) s in all"; \
	  exit $$status

test-clock:
	@date +%s > .make-test-t0

# The setup of `make test` in parallel: llama.cpp's build takes the cores, the models' download the network,
# the Debian packages (bubblewrap, then chromium: one apt at a time) the disk.
test-setup: setup-dev test-models browser

test-models: $(VENV)/.setup-base
	$(BIN)/python -m evalbot.reference.registry fetch $(DEMO_MODEL) qwen2.5-coder-1.5b

# The edit loop: lint, then the unit tests on every core as `make test` runs them. Without the tests that
# need what only `make test` sets up (the models, llama.cpp) or that take minutes: those marked timing
# (A/B runs, clocks), slow (the real models; conftest marks every user of the real-model fixtures),
# reference (llama.cpp) and e2e (`evalbot evaluate` building and serving engines end to end).
check: setup-tools sandbox
	$(MAKE) --no-print-directory lint
	@echo "make check: the unit tests; left to make test: the tests marked timing, slow, reference and e2e"
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder \
	  -m "not timing and not slow and not reference and not e2e"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .make-test-t0 .make-test-t1 $(DEMO_DIR)
