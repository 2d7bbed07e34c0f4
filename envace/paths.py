"""Where the stages read and write, relative to the project folder.

The artifacts one stage writes and another reads are named here once, so no stage imports
another stage (a stage's code dependencies in dvc.yaml are then its own import closure).
dvc.yaml names the same paths.
"""

from pathlib import Path

RAW = Path("data/raw/episodes.jsonl")  # collect
COLLECTED = Path("metrics/collect.json")  # collect: where each domain's episodes came from
PREPARED = Path("data/prepared")  # prepare: {train,val,test}.jsonl
TOKENIZER = PREPARED / "tokenizer"  # prepare
BASE_MODEL = Path("models/base")  # base_model
WARMUP_MODEL = Path("models/warmup")  # warmup
TRAIN_MODELS = Path("models/train")  # train: one folder per variant
TRAIN_METRICS = Path("metrics/train")  # train: one file per variant
EVAL_METRICS = Path("metrics/eval.json")  # evaluate
