"""Teaching ACT to read a rehearsal memory: a short supervised start before GRPO.

A model never shown a memory is thrown by one (measured: greedy success 0.74 -> 0.02 with
one imagined transcript in its context), so GRPO alone, whose memory-reading episodes
then nearly all fail, has little to learn from. Before GRPO, ACT is fine-tuned on
successful logged episodes, two in three with a memory in their context as it looks at
test time: first the episode's own plan (`roles.plan_text`), then, half the time, the
plan of another logged episode of the same kind. ACT's target is the logged episode, so
it learns to make the first entry's lookups and to decide on the real responses. No real
call is made. Every RL variant starts from it (learning only from successful logs is
itself a gain: 0.585 -> 0.649 on the test tasks, measured), but only `envace` goes on to
play with memories in GRPO.

REHEARSE is trained beside ACT on the same episodes' real responses (`rehearse_examples`),
as in the warmup. The weights are shared, so ACT-only updates wore REHEARSE down — the
rehearser the gate had passed — and `envace`'s GRPO then played on a broken one (measured:
one seed's rehearsal exact match 0.972 after warmup, 0.006 after GRPO, which solved not one
imagined episode in 50 steps and so learned nothing).
"""

from __future__ import annotations

import random

import torch

from envace.roles import encode
from envace.train.data import collate, length_batches, recorded_steps, rehearse_segments
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


def rehearse_examples(episodes: list[dict], template, tokenizer, n: int, seed: int, max_len: int,
                      privileged_dropout: float) -> list[tuple[list[int], list[int]]]:
    """REHEARSE examples from the same `n` successful episodes as `memory_examples`: each
    episode's recorded calls with their real responses as targets, the privileged facts
    dropped with probability `privileged_dropout` (as in the warmup)."""
    solved = [e for e in episodes if e.get("success")]
    if not solved or n <= 0:
        return []
    rng = random.Random(f"{seed}-rehearse")
    out, memo = [], {}
    for k in range(n):
        episode = solved[k * len(solved) // n]
        steps = recorded_steps(episode)
        if steps:  # an episode without calls has nothing to rehearse
            ids, roles = encode(tokenizer, rehearse_segments(episode["task"], steps, template, rng, privileged_dropout), memo)
            out.append((ids[:max_len], roles[:max_len]))
    return out


def teach_memory(model, examples: list[tuple[list[int], list[int]]], pad_id: int, lr: float, batch_size: int,
                 grad_clip: float, seed: int, lambda_env: float = 1.0) -> dict[str, float]:
    """One pass of SFT over `examples` (ACT's and REHEARSE's, L_act + lambda_env * L_rehearse);
    returns each role's mean loss over the last tenth of the batches that hold its targets."""
    if not examples:
        return {"act_loss": 0.0, "rehearse_loss": 0.0}
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98))
    model.train()
    losses: dict[str, list[float]] = {"act": [], "rehearse": []}
    for batch in length_batches([len(ids) for ids, _ in examples], batch_size, random.Random(seed)):
        parts = warmup_loss(model, collate([examples[i] for i in batch], pad_id), lambda_env=lambda_env)
        parts["loss"].backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        opt.zero_grad()
        for role, seen in losses.items():
            if parts[f"{role}_tokens"] > 0:
                seen.append(float(parts[role].detach()))
    model.eval()
    return {f"{role}_loss": _tail_mean(seen) for role, seen in losses.items()}


def _tail_mean(values: list[float]) -> float:
    tail = values[-max(1, len(values) // 10):]
    return sum(tail) / len(tail) if tail else 0.0
