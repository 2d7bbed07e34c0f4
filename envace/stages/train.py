"""Stage `train`: role-wise GRPO from the warmup model, one variant per run.

`python -m envace.stages.train --variant envace` (also `real_env`, `simulator`): the same
number of updates for every variant; `sft` is the warmup model itself and trains nothing.
Writes models/train/<variant> and metrics/train/<variant>.json (per-step telemetry, the
real-backend calls made in training). `envace` asserts it made none.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from envace.config import Params
from envace.io import read_jsonl, write_json
from envace.stages import StageFailed
from envace.stages.prepare import PREPARED
from envace.stages.warmup import MODEL_DIR as WARMUP_DIR

MODELS = Path("models/train")
METRICS = Path("metrics/train")


def run(params: Params, variant: str = "envace") -> dict[str, Path]:
    """Train one variant by role-wise GRPO on training tasks, starting from the warmup model."""
    import lightning as L
    import torch

    from envace.data.tokenizer import model_json
    from envace.domains.base import Task
    from envace.model import load, save
    from envace.roles import act_text
    from envace.rollout.runner import Policy
    from envace.tracking import lightning_logger
    from envace.train.grpo import VARIANTS, GRPOModule, leak_token_ids

    if variant not in VARIANTS:
        raise StageFailed(f"unknown variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    if not (WARMUP_DIR / "config.json").exists():
        raise StageFailed(f"{WARMUP_DIR} holds no model: run the warmup stage first")
    cfg = params.train
    L.seed_everything(cfg.seed, verbose=False)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tokenizer = load(WARMUP_DIR)
    policy = Policy(model, tokenizer)
    out_dir, metrics_path = MODELS / variant, METRICS / f"{variant}.json"
    start = time.perf_counter()
    if variant == "sft":
        save(model, tokenizer, out_dir)
        write_json(metrics_path, {"variant": variant, "steps": 0, "real_env_calls_train": 0, "history": []})
        return {"model": out_dir, "metrics": metrics_path}

    episodes = list(read_jsonl(PREPARED / "train.jsonl"))
    tasks = [Task.from_dict(e["task"]) for e in episodes]
    messages = [m for e in episodes for m in e["messages"]]
    leak = leak_token_ids(tokenizer, [model_json(m["response"]) for m in messages if m["role"] == "tool"],
                          [act_text(m) for m in messages if m["role"] == "act"])
    simulator = Policy(load(WARMUP_DIR)[0].eval(), tokenizer) if variant == "simulator" else None
    module = GRPOModule(policy, tasks, variant, cfg, params.rollout, params.roles, leak, simulator=simulator)
    trainer = L.Trainer(max_steps=cfg.steps, accelerator="auto", logger=lightning_logger(f"train-{variant}"),
                        enable_checkpointing=False, log_every_n_steps=1, enable_progress_bar=sys.stderr.isatty(),
                        enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(range(cfg.steps), batch_size=1))
    if variant == "envace" and module.real_calls:
        raise StageFailed(f"envace made {module.real_calls} real-backend calls in training; it must make none")
    model.eval()
    save(model, tokenizer, out_dir)
    write_json(metrics_path, {"variant": variant, "steps": cfg.steps, "real_env_calls_train": module.real_calls,
                              "wall_s": round(time.perf_counter() - start, 1), "history": module.history})
    last = module.history[-1] if module.history else {}
    print(f"train[{variant}]: {cfg.steps} steps in {time.perf_counter() - start:.0f}s; last reward "
          f"{last.get('reward', 0):.3f}, real-backend calls {module.real_calls}", flush=True)
    return {"model": out_dir, "metrics": metrics_path}


if __name__ == "__main__":
    from envace.stages import main
    from envace.train.grpo import VARIANTS

    main("train", run, variants=VARIANTS)
