"""Where a warmup step's time goes: batch building, forward, backward, optimizer, and the
operators underneath (torch.profiler), so training throughput can be set against the CPU's
fp32 matmul ceiling (`bench/matmul.py`).

Run after `dvc repro base_model`: `.venv/bin/python bench/profile_warmup.py [--steps 20]`.
Trains `--steps` warmup steps (after 5 unmeasured ones) of the default model on the prepared
training episodes, with warmup's own dataset, batching and loss, and prints the phases' share
of the wall time, tokens/s, and the operator groups' share of the profiled CPU time; then the
time warmup spends between epochs drawing the next epoch's examples (privileged dropout,
renaming, tokenizing: `SFTDataset.resample` over every training episode) against an epoch's
steps at the measured rate.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict

import torch

GROUPS = {  # operator name fragments -> what they are
    "matmul (projections, LM head)": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention (SDPA)": ("scaled_dot_product", "flash_attention"),
    "softmax / log-softmax": ("softmax",),
    "optimizer (AdamW)": ("_foreach", "adam"),
}


def group_of(name: str) -> str:
    for group, fragments in GROUPS.items():
        if any(f in name.lower() for f in fragments):
            return group
    return "elementwise and other"


def warmup_setup(episodes: int):
    """The default params, the base model, its policy, warmup's dataset over the first
    `episodes` training episodes (0: all; epoch 1's relabelling) and its length-bucketed batches."""
    from envace.config import load_params
    from envace.io import read_jsonl
    from envace.model import load, max_len
    from envace.paths import BASE_MODEL, PREPARED
    from envace.rollout.runner import Policy
    from envace.train.data import SFTDataset, length_batches

    params = load_params()
    model, tokenizer = load(BASE_MODEL)
    policy = Policy(model, tokenizer, max_len(params.model, model))
    logged = list(read_jsonl(PREPARED / "train.jsonl"))[: episodes or None]
    data = SFTDataset(logged, policy.template, tokenizer, params.roles.privileged_dropout, 0, max_len=policy.max_len,
                      max_repeat=params.warmup.rare_tool_repeat, relabel_rate=params.warmup.relabel_rate)
    data.resample(1)
    batches = length_batches([len(ids) for ids, _ in data.examples], params.warmup.batch_size, random.Random(0))
    return params, model, policy, data, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=800, help="training episodes the batches come from")
    args = parser.parse_args()

    from envace.train.data import collate
    from envace.train.losses import warmup_loss

    torch.set_num_threads(2)
    params, model, policy, data, batches = warmup_setup(args.episodes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.warmup.lr)
    phases, tokens = defaultdict(float), 0

    def step(indices, timed: bool) -> None:
        nonlocal tokens
        marks = [time.perf_counter()]
        batch = collate([data[i] for i in indices], policy.pad_id)
        marks.append(time.perf_counter())
        loss = warmup_loss(model, batch, params.warmup.lambda_env)["loss"]
        marks.append(time.perf_counter())
        optimizer.zero_grad()
        loss.backward()
        marks.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(model.parameters(), params.warmup.grad_clip)
        optimizer.step()
        marks.append(time.perf_counter())
        if timed:
            for name, a, b in zip(("batch building", "forward", "backward", "optimizer"), marks, marks[1:]):
                phases[name] += b - a
            tokens += sum(len(data.examples[i][0]) for i in indices)

    for indices in batches[:5]:
        step(indices, timed=False)
    for indices in batches[5 : 5 + args.steps]:
        step(indices, timed=True)
    total = sum(phases.values())
    print(f"{args.steps} warmup steps of batch {params.warmup.batch_size}: {total / args.steps * 1000:.0f} ms a step, "
          f"{tokens / total:,.0f} tokens/s")
    for name, seconds in phases.items():
        print(f"  {name:<16} {seconds / total:>6.1%}")

    from torch.profiler import profile

    with profile() as prof:
        for indices in batches[5 : 5 + args.steps]:
            step(indices, timed=False)
    shares = defaultdict(float)
    for event in prof.key_averages():
        shares[group_of(event.key)] += event.self_cpu_time_total
    cpu = sum(shares.values())
    print("operators (share of profiled CPU time):")
    for group, us in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {group:<30} {us / cpu:>6.1%}")

    full = warmup_setup(0)[3]  # every training episode, as warmup draws them
    draws = []
    for epoch in (2, 3, 4):
        start = time.perf_counter()
        full.resample(epoch)
        draws.append(time.perf_counter() - start)
    steps = -(-len(full) // params.warmup.batch_size) * total / args.steps
    print(f"an epoch's examples ({len(full):,}): {min(draws):.1f}-{max(draws):.1f} s to draw, "
          f"against ~{steps:.0f} s of steps an epoch at this rate")


if __name__ == "__main__":
    main()
