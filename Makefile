# Everything a fresh machine needs: `make demo` runs the main job, `make test` the import contracts and the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

.PHONY: install assets demo serve test test-browser test-slow test-gpu bench mutation clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch pulls a CUDA build of several GB
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

assets: $(STAMP)
	$(BIN)/python -m dynvocab.data.assets

demo: assets
	$(OFFLINE) $(BIN)/dynvocab demo

# the OpenAI-compatible server on the offline default (SmolLM2, Wikipedia) at http://127.0.0.1:8000; SERVE_ARGS adds flags
serve: assets
	$(OFFLINE) $(BIN)/dynvocab serve $(SERVE_ARGS)

test: assets
	$(BIN)/lint-imports
	$(OFFLINE) $(BIN)/python -m pytest -q

test-slow: assets
	$(OFFLINE) $(BIN)/python -m pytest -q -m slow

# on a machine with a CUDA device: the core's GPU paths against its CPU paths, faiss-gpu against faiss-cpu (install the
# gpu extra: pip uninstall faiss-cpu && pip install -e ".[gpu]"), and training where PartialState puts it
test-gpu: assets
	$(OFFLINE) $(BIN)/python -m pytest -q -m "gpu or not slow" $(addprefix tests/dynvocab/,test_cuda.py test_shortlist.py) tests/retrieval/index/test_faiss_gpu.py \
		$(addprefix tests/dynvocab/training/,test_state_cache.py test_loss.py test_trainer.py)

# the page's test in headless Chromium (Debian's package, driven by Playwright), and its screenshot for the docs
test-browser: assets
	command -v chromium || apt-get install -y chromium
	$(BIN)/pip install -q -c constraints.txt playwright
	DYNVOCAB_PAGE_SCREENSHOT=$(CURDIR)/docs/serving-page.png $(OFFLINE) $(BIN)/python -m pytest -q tests/dynvocab/serving/test_page.py

bench: assets
	$(OFFLINE) $(BIN)/python examples/benchmark_core.py
	$(OFFLINE) $(BIN)/python examples/benchmark_retrieval.py --full

# mutation testing of the core (mutmut 3, settings in pyproject.toml); minutes to hours, so not part of `make test`
mutation: assets
	rm -rf mutants
	# one torch thread: mutmut forks a warm process per mutant, and a forked OpenMP pool deadlocks
	OMP_NUM_THREADS=1 DYNVOCAB_ASSETS=$(CURDIR)/.cache/assets $(OFFLINE) $(BIN)/mutmut run --max-children 2
	$(BIN)/mutmut export-cicd-stats && cat mutants/mutmut-cicd-stats.json

clean:
	rm -rf $(VENV) build *.egg-info
