# Two commands do all set-up on a fresh machine:
#   make serve   create .venv if missing, install nereid, the example models' dependencies and
#                tritonclient, serve model_repository/ on 127.0.0.1: HTTP on PORT (8000), gRPC on
#                PORT+1, metrics on PORT+2 (GRPC_PORT=, METRICS_PORT= to choose them apart;
#                ARGS="--log-verbose 1" for more flags)
#   make test    the same set-up plus test dependencies, then the whole suite (mypy --strict,
#                import contracts, pytest), then the e2e tests that depend on where model code
#                runs again with process instances, and those that depend on the config file
#                again with config.pbtxt (markers chosen in tests/conftest.py)
#   make test-full   the same, with both extra passes over the whole e2e suite (slower)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch for the example models, pinned so every machine gets the same release. Which build
# is the index's choice: PyPI's Linux x86_64 wheel is the CUDA build (several GB of NVIDIA
# packages); TORCH_INDEX=https://download.pytorch.org/whl/cpu takes PyTorch's CPU build.
# (On this project's machines a local wheel folder supplies the CPU build.)
TORCH := torch==2.13.0
TORCH_INDEX ?=
PORT ?= 8000
GRPC_PORT ?= $(shell echo $$(( $(PORT) + 1 )))
METRICS_PORT ?= $(shell echo $$(( $(PORT) + 2 )))
ARGS ?=
# make test runs pytest in JOBS processes (pytest-xdist; each test file stays in one of
# them, so a file's module-scoped servers are shared; tests/conftest.py keeps their ports
# apart). Two suit a 2-core machine, where most of a test's time is a server starting or
# answering; JOBS=1 runs the suite in one process.
JOBS ?= 2
PYTEST := $(BIN)/python -m pytest -q $(if $(filter-out 1,$(JOBS)),-n $(JOBS) --dist loadfile)

.PHONY: serve test test-full install install-test perf-analyzer lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned in the same pip command as anything that depends on it, so pip never
# resolves another release. With TORCH_INDEX, torch comes from that index first (pip then
# keeps it).
# `clients`: tritonclient's HTTP client, so the README's snippets and clients/ run with
# .venv/bin/python right after `make serve`.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(if $(TORCH_INDEX),$(BIN)/pip install -q --index-url '$(TORCH_INDEX)' '$(TORCH)')
	$(BIN)/pip install -q -e '.[examples,clients]' '$(TORCH)'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test,examples,clients]' '$(TORCH)'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

serve: install
	$(BIN)/nereid serve --model-repository model_repository --http-port $(PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) $(ARGS)

perf-analyzer: install-test
	bash perf/install_perf_analyzer.sh

lint: install-test
	$(BIN)/lint-imports
	$(BIN)/mypy

# The extra passes re-run only the e2e tests whose behaviour depends on the pass's setting
# (markers isolation_sensitive, config_format_sensitive and workers_sensitive, chosen file by file in
# tests/conftest.py by what each file exercises, test by test where only some of a file's
# tests depend on it, plus a smoke: every example model and every datatype): three full e2e
# passes took most of a 17-23 minute `make test` on a 2-core machine, spent on front-end
# tests (HTTP framing, gRPC, TLS, CLI) that no pass changes.
# `make test-full` runs the extra passes over the whole e2e suite.
test: install-test perf-analyzer
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(PYTEST)
	$(PYTEST) tests/e2e --isolation process -m isolation_sensitive   # every model in process instances
	$(PYTEST) tests/e2e --repo-format pbtxt -m config_format_sensitive   # every config as Triton's config.pbtxt
	$(PYTEST) tests/e2e --workers 2 -m workers_sensitive   # HTTP through 2 front-end worker processes

test-full: install-test perf-analyzer
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(PYTEST)
	$(PYTEST) tests/e2e --isolation process
	$(PYTEST) tests/e2e --repo-format pbtxt
	$(PYTEST) tests/e2e --workers 2

bench: install-test perf-analyzer
	$(BIN)/python perf/bench_identity.py

clean:
	rm -rf $(VENV) .tools
