"""How fast does the embedded default learn to rehearse? Equal wall-clock training, side by side.

Trains the default model under each variant for the same number of seconds (training time
only, evaluation not counted; the warmup LR, held constant after its warmup steps) on the
prepared train split, and prints rehearsal exact match (privileged facts shown, greedy) on
an even spread of val at checkpoints. Needs the data stages first (`make run`).

    .venv/bin/python bench/learnability.py                      # embedding_std 0.02 vs 0.1, 300 s each
    .venv/bin/python bench/learnability.py --seconds 120 --variants "num_heads=4" "num_heads=8"
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from envace.config import load_params
from envace.evaluate.rehearsal import rehearsal_accuracy
from envace.io import read_jsonl
from envace.model import build_default
from envace.rollout.runner import Policy
from envace.paths import PREPARED, TOKENIZER
from envace.data.splits import spread
from envace.train.data import SFTDataset, collate, length_batches
from envace.train.losses import warmup_loss


def train_for(overrides: dict, seconds: float, checkpoints: int, params) -> list[tuple[float, float]]:
    from transformers import PreTrainedTokenizerFast

    cfg, w = params.model.model_copy(update=overrides), params.warmup
    tokenizer = PreTrainedTokenizerFast.from_pretrained(TOKENIZER)
    model = build_default(cfg, tokenizer)
    policy = Policy(model, tokenizer)
    data = SFTDataset(list(read_jsonl(PREPARED / "train.jsonl")), policy.template, tokenizer,
                      params.roles.privileged_dropout, w.seed, max_repeat=w.rare_tool_repeat,
                      relabel_rate=w.relabel_rate)
    val = spread(list(read_jsonl(PREPARED / "val.jsonl")), w.check_episodes)
    opt = torch.optim.AdamW(model.parameters(), lr=w.lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, w.warmup_steps)))
    rng, trained, curve, epoch = random.Random(w.seed), 0.0, [], 0
    marks = [seconds * (i + 1) / checkpoints for i in range(checkpoints)]
    while marks:
        for batch in length_batches([len(x) for x, _ in data.examples], w.batch_size, rng):
            start = time.perf_counter()
            loss = warmup_loss(model, collate([data.examples[i] for i in batch], policy.pad_id), w.lambda_env)["loss"]
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), w.grad_clip)
            opt.step()
            sched.step()
            trained += time.perf_counter() - start
            if trained >= marks[0]:
                model.eval()
                curve.append((marks.pop(0), rehearsal_accuracy(policy, val, privileged=True)["exact"]))
                model.train()
                if not marks:
                    break
        epoch += 1
        data.resample(epoch)
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=["embedding_std=0.02", "embedding_std=0.1"],
                        help="model-config overrides, one variant each: key=value[,key=value]")
    args = parser.parse_args()
    params = load_params()
    results = {}
    for variant in args.variants:
        overrides = {k: type(getattr(params.model, k))(v) for k, v in (kv.split("=") for kv in variant.split(","))}
        results[variant] = train_for(overrides, args.seconds, args.checkpoints, params)
        print(f"{variant}: " + ", ".join(f"{t:.0f}s {acc:.3f}" for t, acc in results[variant]), flush=True)
    base = args.variants[0]
    print("\nrehearsal exact on val (with facts) at equal training time")
    for variant, curve in results.items():
        last, ref = curve[-1][1], results[base][-1][1]
        print(f"  {variant:30s} {last:.3f}" + (f"  ({last / ref:.2f}x {base})" if variant != base and ref else ""))


if __name__ == "__main__":
    main()
