"""Copy pretraining: the embedded default learns to copy in order before it sees any log.

Why: REHEARSE writes tool responses whose values (a title, a branch `perf/logging`) are
several tokens copied from the facts or the history, in order. That takes an induction
circuit — one head that looks one token back, one that finds the token just written earlier
in the context and copies the one after it. A model trained from scratch on the logs alone
never formed one (no head put more than 0.07 of its attention on the previous token), so it
copied which words a value has but not their order. On rows of random tokens where a span is
written twice in a row, the same model forms the circuit within a few thousand steps (a
sudden drop of the loss, then ~99% of the second copy right), because there copying in
order is the only thing that lowers the loss. A pretrained checkpoint brings this circuit
along; `model.copy_steps` gives it to the embedded default.

Rows are `ROW` tokens drawn uniformly from the tokenizer's non-special vocabulary: filler,
then a span of `SPAN` tokens, then the span again; the loss is on the repeat after its first
token (the first cannot be known).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import torch

ROW = 64
SPAN = (8, 28)  # shortest, longest span: the offset between the copies varies, so only content finds it
BATCH = 32
LR = 1e-3
WARMUP_STEPS = 100
EVAL_ROWS = 256


def copy_rows(rng: random.Random, n: int, vocab: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [n, ROW], mask [n, ROW]): filler + span + span; mask marks the repeat's tokens after its first."""
    ids, mask = [], []
    for _ in range(n):
        length = rng.randint(*SPAN)
        span = [rng.choice(vocab) for _ in range(length)]
        ids.append([rng.choice(vocab) for _ in range(ROW - 2 * length)] + span + span)
        mask.append([False] * (ROW - length + 1) + [True] * (length - 1))
    return torch.tensor(ids), torch.tensor(mask)


def copy_loss(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Cross-entropy of the masked next tokens (logits only where needed), and their accuracy."""
    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1][mask[:, 1:]]
    logits, target = model.lm_head(hidden), ids[:, 1:][mask[:, 1:]]
    return torch.nn.functional.cross_entropy(logits, target), (logits.argmax(-1) == target).float().mean().item()


def copy_vocab(tokenizer) -> list[int]:
    """The ids copy rows are drawn from: every token but the special ones."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def pretrain_copying(model, vocab: Sequence[int], steps: int, seed: int, report_every: int = 500,
                     report: Callable[[str], None] = print) -> float:
    """`steps` > 0. Train `model` in place for `steps` steps on copy rows over `vocab` (AdamW
    at `LR`, linear warmup, gradients clipped at 1); returns the copy accuracy on held-out rows.
    Every `report_every` steps a progress line goes to `report`."""
    torch.manual_seed(seed)
    rng, held_out = random.Random(seed), copy_rows(random.Random(seed + 1), EVAL_ROWS, vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS))
    start = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        loss, _ = copy_loss(model, *copy_rows(rng, BATCH, vocab))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % report_every == 0 or step == steps:
            accuracy = held_out_accuracy(model, held_out)
            report(f"copy pretraining: step {step}/{steps}, loss {loss.item():.3f}, held-out copy accuracy "
                   f"{accuracy:.3f} ({time.perf_counter() - start:.0f}s)")
    return accuracy


def held_out_accuracy(model, held_out: tuple[torch.Tensor, torch.Tensor]) -> float:
    model.eval()
    with torch.no_grad():
        _, accuracy = copy_loss(model, *held_out)
    model.train()
    return accuracy
