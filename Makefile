PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test lint run bench clean

# Creates .venv and installs tandem with its dev tools. torch==2.13.0 is pinned (the CPU wheel
# on this machine's disk) and installed first so nothing later pulls a CUDA build.
setup:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,plots]'
	-$(BIN)/python -m tandem.kernels  # C kernels for this CPU; without a compiler, torch paths serve

lint:
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q

run:
	$(BIN)/tandem serve

bench:
	$(BIN)/python benchmarks/bench_decode.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
