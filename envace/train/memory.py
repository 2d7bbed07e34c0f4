"""Teaching ACT to read a rehearsal memory: a short supervised start before GRPO.

A model never shown a memory is thrown by one (measured: greedy success 0.74 -> 0.02 with
one imagined transcript in its context), so GRPO alone, whose memory-reading episodes
then nearly all fail, has little to learn from. Before GRPO, ACT is fine-tuned on
successful logged episodes, two in three with a memory in their context as it looks at
test time: first the episode's own plan (`roles.plan_text`), then, half the time, the
plan of another logged episode of the same kind. ACT's target is the logged episode, so
it learns to make the first entry's lookups and to decide on the real responses. Only
ACT is trained; no real call is made. Every RL variant starts from it (learning only
from successful logs is itself a gain: 0.585 -> 0.649 on the test tasks, measured), but
only `envace` goes on to play with memories in GRPO.
"""

from __future__ import annotations

import random

import torch

from envace.roles import encode
from envace.train.data import collate, length_batches
from envace.train.losses import warmup_loss


def memory_examples(episodes: list[dict], template, tokenizer, n: int, seed: int,
                    max_len: int) -> list[tuple[list[int], list[int]]]:
    """`n` ACT examples from successful episodes (an even spread): every other one with a
    memory whose first entry is the episode's own plan and, half the time, a second entry
    that of another episode of the same kind; the rest without one (so ACT keeps acting
    well when it has not rehearsed)."""
    solved = [e for e in episodes if e.get("success")]
    if not solved or n <= 0:
        return []
    rng = random.Random(f"{seed}-memory")
    kinds: dict[tuple[str, str], list[dict]] = {}
    for e in solved:
        kinds.setdefault((e["task"]["domain"], e["task"]["task_type"]), []).append(e)
    out, memo = [], {}  # memo: segments recur (headers, the same episode's turns in a memory)
    for k in range(n):
        episode = solved[k * len(solved) // n]
        task, messages = episode["task"], episode["messages"]
        memory = None
        if k % 3:
            memory = [messages[1:]]
            if rng.random() < 0.5:
                memory.append(rng.choice(kinds[(task["domain"], task["task_type"])])["messages"][1:])
        ids, roles = encode(tokenizer, template.act(task["tools"], task["request"], messages, memory=memory, policy=task.get("policy", "")), memo)
        out.append((ids[:max_len], roles[:max_len]))
    return out


def teach_memory(model, examples: list[tuple[list[int], list[int]]], pad_id: int, lr: float, batch_size: int,
                 grad_clip: float, seed: int) -> float:
    """One pass of ACT-only SFT over `examples`; returns the mean ACT loss of the last tenth."""
    if not examples:
        return 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98))
    model.train()
    losses = []
    for batch in length_batches([len(ids) for ids, _ in examples], batch_size, random.Random(seed)):
        parts = warmup_loss(model, collate([examples[i] for i in batch], pad_id), lambda_env=0.0)
        parts["loss"].backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        opt.zero_grad()
        losses.append(float(parts["act"].detach()))
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return sum(tail) / len(tail)
