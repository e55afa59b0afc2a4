# Two commands do all set-up on a fresh machine:
#   make serve   create .venv if missing, install nereid and tritonclient, serve model_repository/
#                on 127.0.0.1:8000 (PORT=8001 for another port, ARGS="--log-verbose 1" for more flags)
#   make test    the same set-up plus test dependencies, then the whole suite (mypy --strict,
#                import contracts, pytest; the e2e tests a second time with process instances)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch (a bare `torch` requirement would pull a multi-GB CUDA build).
TORCH_CPU := torch==2.13.0
PORT ?= 8000
ARGS ?=

.PHONY: serve test install install-test perf-analyzer lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned in the same pip command as anything that depends on it, so pip never
# resolves a newer (CUDA) build.
# `clients`: tritonclient's HTTP client, so the README's snippets and clients/ run with
# .venv/bin/python right after `make serve`.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[examples,clients]' '$(TORCH_CPU)'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test,examples,clients]' '$(TORCH_CPU)'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

serve: install
	$(BIN)/nereid serve --model-repository model_repository --http-port $(PORT) $(ARGS)

perf-analyzer: install-test
	bash perf/install_perf_analyzer.sh

lint: install-test
	$(BIN)/lint-imports
	$(BIN)/mypy

test: install-test perf-analyzer
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q
	$(BIN)/python -m pytest -q tests/e2e --isolation process   # the e2e suite again, every model in process instances
	$(BIN)/python -m pytest -q tests/e2e --repo-format pbtxt   # and again, every model's config as Triton's config.pbtxt

bench: install-test perf-analyzer
	$(BIN)/python perf/bench_identity.py

clean:
	rm -rf $(VENV) .tools
