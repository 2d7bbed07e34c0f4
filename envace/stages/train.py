"""Stage `train`: role-wise GRPO from the warmup model, one variant per run.

`python -m envace.stages.train --variant envace` (also `real_env`, `simulator`): the same
number of updates for every variant; `sft` is the warmup model itself and trains nothing.
Writes models/train/<variant>, metrics/train/<variant>.json (per-step telemetry, the
real-backend calls made in training) and plots/train/<variant>.csv (reward and success per
step); its wall clock goes to timings/train@<variant>.json. `envace` asserts it made no real call.

A checkpoint is written after every step (`checkpoints/train/<variant>/last.ckpt`); a run
killed mid-training resumes from it when started again with the same params and warmup
model (each step's sampling is seeded by its step, so it ends where an uninterrupted run
would), and the checkpoint is removed once the variant has finished.

Every RL variant begins with the same supervised start of ACT (`supervised_start`), so the
first variant to run saves its weights (`checkpoints/train/supervised_start/<stamp>.pt`) and
the others load them instead of repeating it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from envace.config import Params
from envace.io import read_jsonl, write_csv, write_json, write_timings
from envace.paths import PREPARED, TRAIN_METRICS, TRAIN_MODELS, WARMUP_MODEL
from envace.stages import StageFailed

MODELS, METRICS = TRAIN_MODELS, TRAIN_METRICS
PLOTS = Path("plots/train")  # one curve per variant
CHECKPOINTS = Path("checkpoints/train")
SHARED_START = CHECKPOINTS / "supervised_start"  # one file: the supervised start every RL variant begins from


def run(params: Params, variant: str = "envace") -> dict[str, Path]:
    """Train one variant by role-wise GRPO on training tasks, starting from the warmup model."""
    from envace.train import VARIANTS

    if variant not in VARIANTS:
        raise StageFailed(f"unknown variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    if not any((WARMUP_MODEL / f).exists() for f in ("config.json", "adapter_config.json")):
        raise StageFailed(f"{WARMUP_MODEL} holds no model: run the warmup stage first")
    if variant == "sft":
        return sft(params)
    import lightning as L
    import torch

    from envace.domains.base import Task
    from envace.evaluate.real import unavailable
    from envace.model import autocast_dtype, load, max_len, precision_of, save, weights_dtype
    from envace.roles import leak_words_of
    from envace.rollout.runner import Policy
    from envace.tracking import lightning_logger
    from envace.train import trainer_options
    from envace.train.checkpoint import fingerprint, last_checkpoint, resumable
    from envace.train.grpo import GRPOModule

    cfg = params.train
    L.seed_everything(cfg.seed, verbose=False)
    precision = precision_of(params.trainer)
    model, tokenizer = load(WARMUP_MODEL, dtype=weights_dtype(precision), trainable=True)
    policy = Policy(model, tokenizer, max_len(params.model, model), autocast_dtype(precision))
    out_dir, metrics_path = MODELS / variant, METRICS / f"{variant}.json"
    start = time.perf_counter()
    episodes = list(read_jsonl(PREPARED / "train.jsonl"))
    tasks = [Task.from_dict(e["task"]) for e in episodes]
    why_not = unavailable(tasks) if variant == "real_env" else None
    if why_not:  # logs only: nothing to train against, said so
        save(model, tokenizer, out_dir)
        write_json(metrics_path, {"variant": variant, "steps": 0, "real_env_calls_train": 0, "history": [],
                                  "skipped": why_not})
        write_curve(variant, [])
        print(f"train[real_env]: skipped: {why_not}", flush=True)
        return {"model": out_dir, "metrics": metrics_path}
    simulator = None
    if variant == "simulator":
        frozen = load(WARMUP_MODEL, dtype=weights_dtype(precision))[0].eval().requires_grad_(False)
        simulator = Policy(frozen, tokenizer, policy.max_len, policy.autocast)
    module = GRPOModule(policy, tasks, variant, cfg, params.rollout, params.roles, leak_words_of(episodes),
                        simulator=simulator)
    ckpt_dir = CHECKPOINTS / variant
    trainer = L.Trainer(max_steps=cfg.steps * cfg.ppo_epochs, **trainer_options(params.trainer),
                        logger=lightning_logger(f"train-{variant}"), callbacks=[last_checkpoint(ckpt_dir / "last.ckpt")],
                        enable_checkpointing=False, log_every_n_steps=1, enable_progress_bar=sys.stderr.isatty())
    resume = resumable(ckpt_dir, fingerprint(params, ("train", "rollout", "roles", "model", "trainer"), [WARMUP_MODEL]),
                       f"train[{variant}]", prepare=trainer.is_global_zero)
    if cfg.memory_examples and resume is None:  # every RL variant starts alike, so the comparison stays fair
        module.supervised_start = supervised_start(policy, episodes, params, variant)  # every rank alike
    trainer.fit(module, torch.utils.data.DataLoader(range(cfg.steps), batch_size=1), ckpt_path=resume)
    if not trainer.is_global_zero:  # the other ranks' work ends with training; rank 0 writes
        return {}
    if module.rank_divergence:
        raise StageFailed(f"the {trainer.world_size} data-parallel ranks ended with different weights "
                          f"(checksums differ by {module.rank_divergence:.3g})")
    if variant == "envace" and module.real_calls:
        raise StageFailed(f"envace made {module.real_calls} real-backend calls in training; it must make none")
    model = policy.model.eval()  # under FSDP the replica, which holds the final weights
    save(model, tokenizer, out_dir)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    write_json(metrics_path, {"variant": variant, "steps": cfg.steps, "real_env_calls_train": module.real_calls,
                              "ranks": trainer.world_size,
                              "rank_divergence": module.rank_divergence, "supervised_start": module.supervised_start,
                              "history": module.history})
    write_curve(variant, module.history)
    write_timings(f"train@{variant}", {"wall_s": round(time.perf_counter() - start, 1),
                                       "tokens_per_s": [round(s, 1) for s in module.tokens_per_s]})
    last = module.history[-1] if module.history else {}
    print(f"train[{variant}]: {cfg.steps} steps in {time.perf_counter() - start:.0f}s; last reward "
          f"{last.get('reward', 0):.3f}, real-backend calls {module.real_calls}", flush=True)
    return {"model": out_dir, "metrics": metrics_path}


def write_curve(variant: str, history: list[dict]) -> None:
    """The variant's reward and success per step, as a DVC plot (`plots/train/<variant>.csv`)."""
    fields = ["step", "reward", "success"]
    write_csv(PLOTS / f"{variant}.csv", [{k: h[k] for k in fields} for h in history], fields)


def supervised_start(policy, episodes: list[dict], params: Params, variant: str) -> dict:
    """ACT's supervised start on successful logged episodes, most with a rehearsal memory, with
    REHEARSE trained beside it on their real responses (`envace.train.memory`). Every RL
    variant gets it — it also filters out the logs' mistakes, which would otherwise count as
    envace's gain — though only envace then plays with memories.

    It is the same for every variant (the same warmup model, examples, seed and updates), so
    it runs once: the weights it ends with are saved under a stamp of everything they are
    made from (`start_stamp`), and a variant that finds its stamp loads them instead — the
    same weights to the bit, so the variant trains exactly as if it had run the start itself."""
    import torch

    from envace.model import device_of
    from envace.train.memory import memory_examples, rehearse_examples, teach_memory

    cfg = params.train
    start = time.perf_counter()
    device = device_of(params.trainer)
    policy.model.to(device)
    saved = SHARED_START / f"{start_stamp(params)}.pt"
    if saved.exists():
        try:
            state = torch.load(saved, map_location=device, weights_only=True)
        except Exception as err:  # noqa: BLE001 - torch raises many kinds for a damaged file
            print(f"train[{variant}]: the saved supervised start {saved} is unreadable ({type(err).__name__}); "
                  f"running it again", flush=True)
        else:
            policy.model.load_state_dict(state["weights"])
            policy.model.eval()
            print(f"train[{variant}]: supervised start of ACT loaded from {saved} (run by an earlier variant: "
                  f"{state['summary']['examples']} examples, final ACT loss {state['summary']['act_loss']:.3f})",
                  flush=True)
            return dict(state["summary"])
    made = (episodes, policy.template, policy.tokenizer, cfg.memory_examples, cfg.seed, policy.max_len)
    examples = memory_examples(*made)
    rehearsals = rehearse_examples(*made, params.roles.privileged_dropout)  # keeps the gated rehearser
    losses = teach_memory(policy.model, examples + rehearsals, policy.pad_id, cfg.lr, params.warmup.batch_size,
                          cfg.grad_clip, cfg.seed, params.warmup.lambda_env)
    summary = {"examples": len(examples), "rehearse_examples": len(rehearsals),
               **{k: round(v, 4) for k, v in losses.items()}}
    save_start(saved, policy.model, summary)
    print(f"train[{variant}]: supervised start of ACT on {len(examples)} successful logged examples and of "
          f"REHEARSE on {len(rehearsals)} (final losses: ACT {losses['act_loss']:.3f}, REHEARSE "
          f"{losses['rehearse_loss']:.3f}) in {time.perf_counter() - start:.0f}s", flush=True)
    return summary


def start_stamp(params: Params) -> str:
    """What the supervised start is made from: the params, the warmup model, the training
    episodes, envace's code and the libraries that compute it. A saved start is reused only
    under the same stamp, where running it again would give the same weights."""
    import torch
    import transformers

    import envace
    from envace.train.checkpoint import fingerprint

    code = [f for f in sorted(Path(envace.__file__).parent.rglob("*")) if f.is_file() and "__pycache__" not in f.parts]
    stamp = fingerprint(params, ("model", "trainer", "roles", "warmup", "train"), [WARMUP_MODEL, PREPARED / "train.jsonl", *code])
    return f"{stamp}-{torch.__version__}-{transformers.__version__}".replace("+", "_")


def save_start(path: Path, model, summary: dict) -> None:
    """The start's weights and summary, written aside and renamed (a reader never sees half a
    file; ranks that ran it alike may write in turn, each through its own temp); an older
    stamp's file is removed, and so is the temp of a writer that died before renaming it."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    torch.save({"weights": model.state_dict(), "summary": summary}, part)
    os.replace(part, path)
    for old in path.parent.glob("*.pt"):
        if old != path:
            old.unlink(missing_ok=True)
    for temp in path.parent.glob("*.tmp"):
        if not writer_alive(temp):
            temp.unlink(missing_ok=True)


def writer_alive(temp: Path) -> bool:
    """Whether the process named in a temp's name (`<stamp>.<pid>.tmp`) still runs: a live
    writer (another rank) is about to rename its temp; a dead one's temp is litter."""
    pid = temp.name.rsplit(".", 2)[-2]  # a name without one reads as a dead writer's
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def sft(params: Params) -> dict[str, Path]:
    """`sft` is the warmup model itself, saved under its name: nothing trained (nor Lightning loaded)."""
    from envace.model import load, precision_of, save, weights_dtype

    model, tokenizer = load(WARMUP_MODEL, dtype=weights_dtype(precision_of(params.trainer)), trainable=True)
    out_dir, metrics_path = MODELS / "sft", METRICS / "sft.json"
    save(model, tokenizer, out_dir)
    write_json(metrics_path, {"variant": "sft", "steps": 0, "real_env_calls_train": 0, "history": []})
    write_curve("sft", [])
    return {"model": out_dir, "metrics": metrics_path}


if __name__ == "__main__":
    from envace.stages import main
    from envace.train import VARIANTS  # not from grpo: that loads Lightning and torch before `main` flushes denormals

    main("train", run, variants=VARIANTS)
