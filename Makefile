PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Setup is done once per pyproject.toml: `make run` and `make test` depend on it, so each works by
# itself on a fresh clone and is a no-op install afterwards.
SETUP := $(VENV)/.tandem-setup

.PHONY: setup test lint docs kernels run bench external clients clean

setup: $(SETUP)

# Creates .venv and installs tandem with its dev tools and the Ray extra (the Ray backend's tests
# run in `make test`). torch==2.13.0 is pinned (the CPU wheel on this machine's disk) and
# installed first so nothing later pulls a CUDA build.
$(SETUP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,ray]'
	$(BIN)/python -m tandem.kernels
	touch $(SETUP)

# The C kernels for this CPU. Without a C compiler the torch paths serve and this passes; with one,
# a failed build fails here (and so setup and test), never letting the kernel tests skip.
kernels: $(SETUP)
	$(BIN)/python -m tandem.kernels

lint: $(SETUP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml, docs/) into the git-ignored build/site; --strict fails on a broken
# link or anchor, a missing page or one left out of the nav.
docs: $(SETUP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Two workers, each file on one of them (a file's module-scoped servers start once); the tests'
# wall-clock bounds scale with TANDEM_TEST_SLACK (tests/timing.py) for a loaded machine.
test: lint docs kernels
	$(BIN)/pytest -q -n 2 --dist loadfile

run: $(SETUP)
	$(BIN)/tandem serve

bench: $(SETUP)
	$(BIN)/python benchmarks/bench_decode.py

# llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) compiled for this CPU into its own
# venv in the user's cache, for the external-engine tests (marked `external`; they skip without it).
# The first build compiles llama.cpp (about 18 minutes on 2 shared cores); later runs reuse the wheel.
external:
	deploy/external/build_llamacpp.sh

# Real third-party clients (guidellm streaming, aiperf streaming chat) against `tandem serve` and the
# gateway, zero errors each (tests/clients, marked `clients`; they skip without this venv). Their own
# venv: they pull about 6.5 GB (torch, datasets, ...), some 40 minutes the first time on 2 shared cores.
CLIENTS_VENV := .clients-venv
clients: $(SETUP)
	test -x $(CLIENTS_VENV)/bin/aiperf || ($(PY) -m venv $(CLIENTS_VENV) && \
		$(CLIENTS_VENV)/bin/pip install -q 'guidellm==0.8.1' 'aiperf==0.13.0')
	TANDEM_CLIENTS_VENV=$(CLIENTS_VENV) $(BIN)/pytest -q -m clients tests/clients

clean:
	rm -rf $(VENV) build dist src/*.egg-info
