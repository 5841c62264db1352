# Everything a fresh machine needs: `make demo` runs the main job, `make test` the import contracts and the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

.PHONY: install assets demo test test-slow bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch pulls a CUDA build of several GB
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

assets: $(STAMP)
	$(BIN)/python -m dynvocab.assets

demo: assets
	$(OFFLINE) $(BIN)/dynvocab demo

test: assets
	$(BIN)/lint-imports
	$(OFFLINE) $(BIN)/python -m pytest -q

test-slow: assets
	$(OFFLINE) $(BIN)/python -m pytest -q -m slow

bench: assets
	$(OFFLINE) $(BIN)/python examples/benchmark_core.py
	$(OFFLINE) $(BIN)/python examples/benchmark_retrieval.py --full

clean:
	rm -rf $(VENV) build *.egg-info
