"""warmup — SFT of both roles on the real trajectories, until the rehearsal gate would pass.

Trains up to `warmup.max_epochs`; after each epoch it measures rehearsal exact match
(privileged facts shown) on an even spread of the validation split (`warmup.check_episodes`,
cheap: that is the curve), and from `warmup.min_epochs` on, when the spread passes, on the
whole validation split: it stops once every core tool reaches `gate.min_rehearsal_accuracy`
there. Then ACT plays held-out test tasks greedily in the real backends.

Writes `models/warmup/` (safetensors + tokenizer), `metrics/warmup.json`
({"epochs", "wall_s", "real_success", ...}), training curves as DVC plots
(`plots/warmup_steps.csv`, `plots/warmup_epochs.csv`) and Lightning checkpoints in
`checkpoints/warmup/`. Curves go to MLflow (the flow's stage run when the flow runs it).
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

from envace.config import Params
from envace.io import read_jsonl, write_csv, write_json
from envace.stages.prepare import PREPARED, TOKENIZER

MODEL_DIR = Path("models/warmup")
METRICS = Path("metrics/warmup.json")
STEP_PLOT = Path("plots/warmup_steps.csv")
EPOCH_PLOT = Path("plots/warmup_epochs.csv")
CHECKPOINTS = Path("checkpoints/warmup")


def run(params: Params) -> dict[str, Path]:
    """Warm up both roles on real trajectories; stop once the rehearsal gate would pass."""
    import lightning as L
    import torch

    from envace.domains.base import Task
    from envace.evaluate.real import real_success
    from envace.evaluate.rehearsal import rehearsal_accuracy
    from envace.gates.rehearsal import core_tools
    from envace.model import policy_for, save
    from envace.rollout.runner import Policy
    from envace.train.data import SFTDataset, collate, length_batches
    from envace.tracking import lightning_logger
    from envace.train.warmup import StepCurve, WarmupModule

    cfg, gate = params.warmup, params.gate
    L.seed_everything(cfg.seed, verbose=False)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tokenizer = policy_for(params.model, TOKENIZER)
    policy = Policy(model, tokenizer)
    train = list(read_jsonl(PREPARED / "train.jsonl"))
    val = list(read_jsonl(PREPARED / "val.jsonl"))
    check = spread(val, cfg.check_episodes)
    test_tasks = spread([Task.from_dict(e["task"]) for e in read_jsonl(PREPARED / "test.jsonl")], cfg.eval_tasks)

    dataset = SFTDataset(train, policy.template, tokenizer, params.roles.privileged_dropout, cfg.seed,
                         max_repeat=cfg.rare_tool_repeat, relabel_rate=cfg.relabel_rate, probe_rate=cfg.probe_rate)
    rng = random.Random(cfg.seed)

    class LengthBatches(torch.utils.data.Sampler):
        def __iter__(self):
            return iter(length_batches([len(x) for x, _ in dataset.examples], cfg.batch_size, rng))

        def __len__(self):
            return -(-len(dataset) // cfg.batch_size)

    loader = torch.utils.data.DataLoader(dataset, batch_sampler=LengthBatches(),
                                         collate_fn=lambda b: collate(b, policy.pad_id))
    module = WarmupModule(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, len(loader) * cfg.max_epochs, cfg.lambda_env,
                          cfg.min_lr_ratio)
    epochs: list[dict] = []
    start = time.perf_counter()

    def gate_status(episodes: list[dict], min_examples: int) -> tuple[dict, dict[str, float], bool]:
        model.eval()
        acc = rehearsal_accuracy(policy, episodes, privileged=True, max_new_tokens=params.rollout.max_new_tokens)
        model.train()
        core = core_tools(acc["per_tool"], min_examples)
        return acc, core, bool(core) and min(core.values()) >= gate.min_rehearsal_accuracy

    class GateWatch(L.Callback):
        """After each epoch: rehearsal accuracy on an even spread of val (the curve). From
        `min_epochs` on, when that spread passes, confirm on all of val and stop if it passes."""

        def on_train_epoch_end(self, trainer, pl_module):
            epoch = trainer.current_epoch + 1
            # the spread holds ~1/k of val's calls: judge tools with ~1/k of the minimum
            share = min(1.0, len(check) / max(1, len(val)))
            acc, core, passes = gate_status(check, max(1, round(gate.min_tool_examples * share)))
            confirmed = False
            if passes and epoch >= cfg.min_epochs:
                confirmed = gate_status(val, gate.min_tool_examples)[2] if check is not val else passes
            epochs.append({"epoch": epoch, "val_rehearsal_exact": acc["exact"], "val_rehearsal_field": acc["field"],
                           "val_min_core_tool": min(core.values(), default=0.0),
                           "seconds": round(time.perf_counter() - start, 1)})
            pl_module.log_dict({"val/rehearsal_exact": acc["exact"], "val/min_core_tool": epochs[-1]["val_min_core_tool"]})
            weakest = min(core, key=core.get, default="-")
            print(f"epoch {epoch} ({time.perf_counter() - start:.0f}s): val rehearsal exact {acc['exact']:.3f}, weakest "
                  f"tool {weakest} {core.get(weakest, 0.0):.3f}{' — gate passes on all of val, stopping' if confirmed else ''}",
                  flush=True)
            trainer.should_stop = confirmed
            dataset.resample(epoch)  # redraw the privileged dropout

    trainer = L.Trainer(
        max_epochs=cfg.max_epochs, accelerator="auto", precision="bf16-mixed" if torch.cuda.is_available() else "32-true",
        logger=lightning_logger("warmup"), callbacks=[GateWatch(), StepCurve(STEP_PLOT), L.pytorch.callbacks.ModelCheckpoint(
            dirpath=CHECKPOINTS, save_last=True, save_top_k=0)],
        reload_dataloaders_every_n_epochs=1, log_every_n_steps=10, num_sanity_val_steps=0,
        gradient_clip_val=cfg.grad_clip, enable_progress_bar=sys.stderr.isatty(),  # piped (the flow): epoch lines only
    )
    trainer.fit(module, loader)
    wall = time.perf_counter() - start
    model.eval()
    save(model, tokenizer, MODEL_DIR)
    real = real_success(policy, test_tasks, params.rollout)
    write_csv(EPOCH_PLOT, epochs)
    write_json(METRICS, {
        "epochs": len(epochs), "wall_s": round(wall, 1), "real_success": real["success"], "real": real,
        "per_epoch": epochs, "stopped_by": "gate" if len(epochs) < cfg.max_epochs else "max_epochs",
    })
    print(f"warmup: {len(epochs)} epoch(s) in {wall:.0f}s; ACT greedy real success {real['success']:.3f} "
          f"on {real['n']} held-out tasks", flush=True)
    return {"model": MODEL_DIR, "metrics": METRICS, "plots": EPOCH_PLOT}


def spread(items: list, n: int) -> list:
    """`n` items evenly spaced through `items` (all of them when n is 0 or too large):
    the splits are ordered by domain, so every domain stays represented."""
    if not n or n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(n)]


if __name__ == "__main__":
    from envace.stages import main

    main("warmup", run)
