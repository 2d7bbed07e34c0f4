"""Denormal floats flushed to zero or not, side by side: warmup steps and greedy generation
from a trained model (a trained model's softmax tails and gradients are full of denormals;
the base model's and random weights hold none, so the other benches cannot show this).

Run after `dvc repro warmup`: `.venv/bin/python bench/denormals.py [--model models/warmup]
[--steps 30] [--rounds 3]`. The setting must be made before torch creates its threads (a
thread takes it from the one that creates it), so each measurement is a fresh process of this
script (`--child 0` as IEEE floats, `--child 1` as the stages run: `flush_denormals` first),
the two in turn per round. A child trains `--steps` warmup steps from the model's weights
(warmup's own dataset, length-bucketed batches and loss, AdamW at warmup's final rate), then
generates 32 tokens greedily after 128 training conversations (cut at 160 tokens) with the lean decoder. Prints each side's
median seconds, the ratio, and how far the two sides' losses and generated tokens part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def child(args) -> None:
    if args.child:
        from envace import flush_denormals

        flush_denormals()
    import torch

    from envace.model import cpu_threads, load
    from envace.rollout.generate import generate
    from envace.train.data import collate
    from envace.train.losses import warmup_loss
    from profile_warmup import warmup_setup  # bench/ is the script's own directory

    torch.set_num_threads(cpu_threads())
    params, _, policy, data, batches = warmup_setup(2000)
    model, _ = load(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.warmup.lr * params.warmup.min_lr_ratio)
    chosen = [collate([data[i] for i in b], policy.pad_id) for b in batches[: args.steps]]
    start, losses = time.perf_counter(), []
    for batch in chosen:
        loss = warmup_loss(model, batch, params.warmup.lambda_env)["loss"]
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), params.warmup.grad_clip)
        optimizer.step()
        losses.append(loss.item())
    steps_s = time.perf_counter() - start

    model, _ = load(args.model)
    model.eval()
    prompts = [ids[:160] for ids, _ in data.examples[:128]]  # conversations of the training set, cut
    start = time.perf_counter()
    tokens = generate(model, prompts, 32, stop_id=-1, pad_id=policy.pad_id)
    generate_s = time.perf_counter() - start
    print(json.dumps({"steps_s": steps_s, "generate_s": generate_s, "losses": losses, "tokens": tokens}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/warmup")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args)

    runs: dict[int, list[dict]] = {0: [], 1: []}
    for _ in range(args.rounds):
        for flush in (0, 1):
            out = subprocess.run([sys.executable, __file__, "--child", str(flush), "--model", args.model,
                                  "--steps", str(args.steps)], capture_output=True, text=True, check=True)
            runs[flush].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.model}: {args.steps} warmup steps, then 32 greedy tokens after 128 conversations; median of {args.rounds} processes each")
    for key, what in (("steps_s", "warmup steps"), ("generate_s", "generation")):
        ieee, flushed = (statistics.median(r[key] for r in runs[f]) for f in (0, 1))
        print(f"  {what:<13} IEEE {ieee:6.2f} s   flushed {flushed:6.2f} s   IEEE / flushed {ieee / flushed:.2f}")
    a, b = runs[0][0], runs[1][0]
    parted = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    same = sum(x == y for x, y in zip(a["tokens"], b["tokens"]))
    print(f"  losses: largest difference over the steps {parted:.1e}; generations equal: {same} of {len(a['tokens'])}")


if __name__ == "__main__":
    main()
