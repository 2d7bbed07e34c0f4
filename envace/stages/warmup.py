"""warmup — SFT of both roles on the real trajectories, until the rehearsal gate would pass.

Trains up to `warmup.max_epochs`; after each epoch it measures rehearsal exact match
(privileged facts shown) on an even spread of the validation split (`warmup.check_episodes`,
cheap: that is the curve), and from `warmup.min_epochs` on, when the spread passes, on the
validation split (`gate.episodes` of it; 0: all): it stops once every tool with
`gate.min_tool_examples` calls there reaches `gate.min_rehearsal_accuracy` (an early stop
only: the rehearsal_gate stage then holds every tool to the bar on the test split). Before training and after it, what the roles can do is
measured (parse rates, rehearsal exact per tool, ACT's greedy success in the real backends).

Starts from `models/base` (stage `base_model`); with `model.lora.rank` > 0 only LoRA
adapters train. Runs where `trainer` says (devices, DDP, precision): `warmup.batch_size`
is the global batch, split across ranks (`train.data.collate`), and only rank 0 writes.

Writes `models/warmup/` (safetensors + tokenizer; adapters for LoRA), `metrics/warmup.json`
({"epochs", "real_success", ...}; the wall clock in `timings/warmup.json`), training curves as DVC plots
(`plots/warmup_steps.csv`, `plots/warmup_epochs.csv`). Curves go to MLflow (the flow's stage
run when the flow runs it).

The whole training state is checkpointed after every epoch (`checkpoints/warmup/last.ckpt`,
`envace.train.checkpoint`): a warmup killed at any point resumes from its last finished epoch
when started again with the same params, base model and data — the batch order, privileged
dropout and curves continue as if uninterrupted, so the weights equal an uninterrupted run's.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from pathlib import Path

from envace.config import Params
from envace.data.splits import spread
from envace.io import read_jsonl, write_csv, write_json, write_timings
from envace.paths import BASE_MODEL, PREPARED, WARMUP_MODEL
from envace.stages import StageFailed

MODEL_DIR = WARMUP_MODEL
METRICS = Path("metrics/warmup.json")
STEP_PLOT = Path("plots/warmup_steps.csv")
EPOCH_PLOT = Path("plots/warmup_epochs.csv")
CHECKPOINTS = Path("checkpoints/warmup")


def run(params: Params) -> dict[str, Path]:
    """Warm up both roles on real trajectories; stop once the rehearsal gate would pass."""
    import lightning as L
    import torch

    from envace.domains.base import Task
    from envace.evaluate.real import real_success, unavailable
    from envace.evaluate.rehearsal import rehearsal_accuracy
    from envace.gates.rehearsal import core_tools
    from envace.model import autocast_dtype, load, max_len, precision_of, save, weights_dtype, with_lora
    from envace.model.copying import copy_vocab
    from envace.rollout.runner import Policy
    from envace.tracking import lightning_logger
    from envace.train import trainer_options
    from envace.train.checkpoint import fingerprint, last_checkpoint, resumable
    from envace.train.data import SFTDataset, collate, length_batches
    from envace.train.warmup import StepCurve, WarmupModule, is_layer_matrix

    cfg, gate = params.warmup, params.gate
    if not (BASE_MODEL / "config.json").exists():
        raise StageFailed(f"{BASE_MODEL} holds no model: run the base_model stage first")
    if cfg.batch_size < params.trainer.devices:
        raise StageFailed(f"warmup.batch_size {cfg.batch_size} is the global batch: it must be at least "
                          f"trainer.devices ({params.trainer.devices})")
    L.seed_everything(cfg.seed, verbose=False)
    precision = precision_of(params.trainer)
    model, tokenizer = load(BASE_MODEL, dtype=weights_dtype(precision))
    model = with_lora(model, params.model.lora)
    optimizer = params.warmup_optimizer()
    if optimizer == "muon" and not any(is_layer_matrix(n, p) for n, p in model.named_parameters() if p.requires_grad):
        raise StageFailed(f"warmup.optimizer muon: {BASE_MODEL} has no decoder-layer weight matrices (parameters named "
                          "*.layers.*) to train with it (set warmup.optimizer: adamw)")
    policy = Policy(model, tokenizer, max_len(params.model, model), autocast_dtype(precision))
    train = spread(list(read_jsonl(PREPARED / "train.jsonl")), cfg.train_episodes)
    val = list(read_jsonl(PREPARED / "val.jsonl"))
    check = spread(val, cfg.check_episodes)
    confirm = spread(val, gate.episodes)  # the gate's own sample size (0: all of val)
    test_tasks = spread([Task.from_dict(e["task"]) for e in read_jsonl(PREPARED / "test.jsonl")], cfg.eval_tasks)
    no_real = unavailable(test_tasks)  # a logs-only domain: ACT's real success cannot be measured

    dataset = SFTDataset(train, policy.template, tokenizer, params.roles.privileged_dropout, cfg.seed,
                         max_len=policy.max_len, max_repeat=cfg.rare_tool_repeat, relabel_rate=cfg.relabel_rate)
    rng = random.Random(cfg.seed)
    trainer_box: list = []  # the Trainer, once made: ranks are known only inside fit

    class GlobalBatches(torch.utils.data.Sampler):
        """Global batches of similar length; every rank iterates all of them and `collate`
        keeps its share."""

        def __iter__(self):
            return iter(length_batches([len(x) for x, _ in dataset.examples], cfg.batch_size, rng))

        def __len__(self):
            return -(-len(dataset) // cfg.batch_size)

    def collate_share(batch):
        return collate(batch, policy.pad_id, trainer_box[0].global_rank, trainer_box[0].world_size)

    loader = torch.utils.data.DataLoader(dataset, batch_sampler=GlobalBatches(), collate_fn=collate_share)
    module = WarmupModule(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, len(loader) * cfg.max_epochs, cfg.lambda_env,
                          cfg.min_lr_ratio, policy, cfg.copy_weight, copy_vocab(tokenizer) if cfg.copy_weight else (), cfg.seed,
                          optimizer)
    epochs: list[dict] = []
    epoch_seconds: list[float] = []  # wall clock at each epoch's end (timings, not tracked metrics)
    clock = {"start": time.perf_counter()}  # moved back by the time a resumed run had already spent
    seconds = lambda: time.perf_counter() - clock["start"]  # noqa: E731
    stopped = {"yes": False}  # the gate stopped training (a resumed run must not train on)
    last_check: dict = {}  # the check spread's rehearsal accuracy after this process's last epoch: the final weights'

    def gate_status(episodes: list[dict], min_examples: int) -> tuple[dict, dict[str, float], bool]:
        policy.model.eval()
        acc = rehearsal_accuracy(policy, episodes, privileged=True, max_new_tokens=params.rollout.max_new_tokens)
        model.train()
        core = core_tools(acc["per_tool"], min_examples)
        return acc, core, bool(core) and min(core.values()) >= gate.min_rehearsal_accuracy

    def skills(acc: dict | None = None) -> tuple[dict, dict]:
        """What the roles can do now: parse rates, rehearsal exact (per tool) on the check spread
        (`acc`: already measured on these weights), ACT's greedy success in the real backends —
        before training and after it. → (summary, the full real-backend result)."""
        policy.model.eval()
        acc = acc or rehearsal_accuracy(policy, check, privileged=True, max_new_tokens=params.rollout.max_new_tokens)
        real = real_success(policy, test_tasks, params.rollout) if not no_real else \
            {"success": None, "act_parse_rate": None, "n": 0, "unavailable": no_real}
        model.train()
        return {"real_success": real["success"], "act_parse_rate": real["act_parse_rate"],
                "rehearsal_exact": acc["exact"], "rehearsal_parse_rate": acc["parse_rate"],
                "rehearsal_exact_per_tool": {t: r["exact"] for t, r in acc["per_tool"].items()}}, real

    before: dict = {}

    class Before(L.Callback):
        """The untrained start, measured on the devices training runs on (every rank alike)."""

        def on_train_start(self, trainer, pl_module):
            if trainer.global_step == 0:  # not when resuming
                pl_module.refresh()
                before.update(skills()[0])

    class GateWatch(L.Callback):
        """After each epoch: rehearsal accuracy on an even spread of val (the curve). From
        `min_epochs` on, when that spread passes, confirm on val (`gate.episodes` of it, an even
        spread; 0: all) and stop if it passes.
        Every rank measures the same (identical weights, greedy), so all stop together."""

        def on_train_epoch_end(self, trainer, pl_module):
            epoch = trainer.current_epoch + 1
            pl_module.refresh()
            # the spread holds ~1/k of val's calls: judge tools with ~1/k of the minimum
            share = min(1.0, len(check) / max(1, len(val)))
            acc, core, passes = gate_status(check, max(1, round(gate.min_tool_examples * share)))
            last_check["acc"] = acc
            confirmed = False
            if passes and epoch >= cfg.min_epochs:
                confirmed = gate_status(confirm, gate.min_tool_examples)[2] if check is not confirm else passes
            epochs.append({"epoch": epoch, "val_rehearsal_exact": acc["exact"], "val_rehearsal_field": acc["field"],
                           "val_min_core_tool": min(core.values(), default=0.0)})
            epoch_seconds.append(round(seconds(), 1))
            pl_module.log_dict({"val/rehearsal_exact": acc["exact"], "val/min_core_tool": epochs[-1]["val_min_core_tool"]})
            weakest = min(core, key=core.get, default="-")
            if trainer.is_global_zero:
                print(f"epoch {epoch} ({seconds():.0f}s): val rehearsal exact {acc['exact']:.3f}, "
                      f"weakest tool {weakest} {core.get(weakest, 0.0):.3f}"
                      f"{' — gate passes on val, stopping' if confirmed else ''}", flush=True)
            trainer.should_stop = stopped["yes"] = confirmed
            if not confirmed and epoch < cfg.max_epochs:  # another epoch follows: redraw its examples
                dataset.resample(epoch)

    class RunState(L.Callback):
        """What a resumed run needs beyond Lightning's own state, saved in each checkpoint: the
        epochs so far, the untrained measurement, the batch order's random state, the time spent."""

        def state_dict(self):
            return {"epochs": epochs, "before": before, "rng": rng.getstate(), "torch_rng": torch.get_rng_state(),
                    "seconds": seconds(), "epoch_seconds": epoch_seconds, "stopped": stopped["yes"]}

        def load_state_dict(self, state):
            epochs[:] = state["epochs"]
            epoch_seconds[:] = state["epoch_seconds"]
            before.update(state["before"])
            rng.setstate(state["rng"])
            torch.set_rng_state(state["torch_rng"])
            clock["start"] = time.perf_counter() - state["seconds"]
            stopped["yes"] = state["stopped"]
            dataset.resample(len(epochs))

        def on_train_start(self, trainer, pl_module):
            if stopped["yes"]:  # killed after the gate had stopped training: nothing is left to train
                trainer.should_stop = True

    trainer = L.Trainer(
        max_epochs=cfg.max_epochs, **trainer_options(params.trainer), logger=lightning_logger("warmup"),
        callbacks=[Before(), GateWatch(), RunState(), StepCurve(STEP_PLOT), last_checkpoint(CHECKPOINTS / "last.ckpt", "epoch")],
        enable_checkpointing=False, reload_dataloaders_every_n_epochs=1, log_every_n_steps=10, num_sanity_val_steps=0,
        gradient_clip_val=cfg.grad_clip, enable_progress_bar=sys.stderr.isatty(),  # piped (the flow): epoch lines only
    )
    trainer_box.append(trainer)
    stamp = fingerprint(params, ("model", "trainer", "roles", "rollout", "warmup", "gate"), [BASE_MODEL, PREPARED])
    resume = resumable(CHECKPOINTS, stamp, "warmup", prepare=trainer.is_global_zero)
    model.train()
    trainer.fit(module, loader, ckpt_path=resume)
    if not trainer.is_global_zero:  # the other ranks' work ends with training; rank 0 writes
        return {}
    if module.rank_divergence:
        raise StageFailed(f"the {trainer.world_size} data-parallel ranks ended with different weights "
                          f"(checksums differ by {module.rank_divergence:.3g})")
    wall = seconds()
    model = policy.model.eval()  # under FSDP the replica, which holds the final weights
    save(model, tokenizer, MODEL_DIR)
    shutil.rmtree(CHECKPOINTS, ignore_errors=True)
    after, real = skills(last_check.get("acc"))
    write_csv(EPOCH_PLOT, epochs)
    write_json(METRICS, {
        "epochs": len(epochs), "real_success": real["success"], "real": real,
        "per_epoch": epochs, "stopped_by": "gate" if len(epochs) < cfg.max_epochs else "max_epochs",
        "ranks": trainer.world_size, "optimizer": optimizer, "train_episodes": len(train), "before": before, "after": after,
    })
    write_timings("warmup", {"wall_s": round(wall, 1), "epoch_seconds": epoch_seconds})
    real_text = (f"ACT greedy real success {before.get('real_success') or 0:.3f} -> {real['success']:.3f} on {real['n']} "
                 f"held-out tasks; ACT outputs parsed {before.get('act_parse_rate') or 0:.2f} -> {after['act_parse_rate']:.2f}"
                 if real["success"] is not None else f"ACT's real success not measured: {no_real}")
    print(f"warmup: {len(epochs)} epoch(s) with {optimizer} in {wall:.0f}s; {real_text}, rehearsals parsed "
          f"{before.get('rehearsal_parse_rate', 0):.2f} -> {after['rehearsal_parse_rate']:.2f}", flush=True)
    return {"model": MODEL_DIR, "metrics": METRICS, "plots": EPOCH_PLOT}



if __name__ == "__main__":
    from envace.stages import main

    main("warmup", run)
