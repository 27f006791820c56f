# Two entry points: `make run` (the main job on the embedded default) and `make test`.
# Both create or reuse .venv and install the product (pyproject.toml) and its benchmarks
# (benchmarks/pyproject.toml, the dressage-bench package that adds `dressage bench`), both editable.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv bench clean

$(STAMP): pyproject.toml benchmarks/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' -e benchmarks
	@touch $(STAMP)

venv: $(STAMP)

# The main job: 2 rollouts of agents -> Proxy -> engine, R3 stored as uint8, large fields through TQ.
RUN_ARGS ?= --use-rollout-routing-replay --enable-transfer-queue --routed-experts-dtype uint8 --json out/run.json
run: $(STAMP)
	@mkdir -p out
	$(VENV)/bin/dressage run $(RUN_ARGS) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# `make bench` adds the benchmark baselines (transferqueue, CPU torch) and runs `dressage bench tq`;
# ARGS=--quick for a run under a minute. Kept out of `dev` so CI stays light.
$(VENV)/.installed-bench: pyproject.toml benchmarks/pyproject.toml $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev]' -e 'benchmarks[baselines]'
	@touch $@

bench: $(VENV)/.installed-bench
	$(VENV)/bin/dressage bench tq --json out/bench_tq.json $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info benchmarks/src/*.egg-info .pytest_cache
