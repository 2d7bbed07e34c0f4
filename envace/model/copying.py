"""Copy pretraining: the embedded default learns to copy in order before it sees any log.

Why: REHEARSE writes tool responses whose values (a title, a branch `perf/logging`) are
several tokens copied from the facts or the history, in order. That takes an induction
circuit — one head that looks one token back, one that finds the token just written earlier
in the context and copies the one after it. A model trained from scratch on the logs alone
never formed one (no head put more than 0.07 of its attention on the previous token), so it
copied which words a value has but not their order. On rows of random tokens where a span
is written twice, copying in order is the only thing that lowers the loss, and the same
model forms the circuit: a sudden drop of the loss after ~2,000 steps, then ~99% of the
repeats right. A pretrained checkpoint brings this circuit along; `model.copy_steps` gives
it to the embedded default, in two phases:

1. `steps` steps on short rows (`SHORT`: filler, a span, the span again at once), where the
   circuit forms fastest;
2. `steps // 3` steps on long rows (`LONG`: the copies a random distance apart),
   at a lower rate. A circuit learned on short rows alone copies nothing 100 tokens back
   (it never saw the rotary positions of such distances), and the logs copy over hundreds.

Tokens are drawn uniformly from the tokenizer's non-special vocabulary; the loss is on the
repeat after its first token (the first cannot be known).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

SPAN = (8, 28)  # shortest, longest span: the offset between the copies varies, so only content finds it
EVAL_ROWS = 256
KEPT_ROWS = 4  # long rows per warmup step under `warmup.copy_weight` (~15% more tokens a step)


@dataclass(frozen=True)
class Phase:
    row: int  # tokens per row
    apart: bool  # the copies a random distance apart (else the repeat follows the span at once)
    batch: int
    lr: float
    warmup_steps: int


SHORT = Phase(row=64, apart=False, batch=32, lr=1e-3, warmup_steps=100)
LONG = Phase(row=512, apart=True, batch=16, lr=3e-4, warmup_steps=0)  # lower: keeps the circuit while it stretches


def copy_rows(rng: random.Random, n: int, vocab: Sequence[int], row: int = SHORT.row,
              apart: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [n, row], mask [n, row]): filler, a span, (filler,) the span again; mask marks the
    repeat's tokens after its first."""
    ids, mask = [], []
    for _ in range(n):
        length = rng.randint(*SPAN)
        span = [rng.choice(vocab) for _ in range(length)]
        gap = rng.randint(0, row - 2 * length) if apart else 0
        filler = [rng.choice(vocab) for _ in range(row - 2 * length)]
        ids.append(filler[gap:] + span + filler[:gap] + span)
        mask.append([False] * (row - length + 1) + [True] * (length - 1))
    return torch.tensor(ids), torch.tensor(mask)


def kept_rows(vocab: Sequence[int], seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The copy rows of warmup step `step`: long rows, the same for a step whatever the run
    (a resumed run, every data-parallel rank)."""
    return copy_rows(random.Random(seed * 1_000_003 + step), KEPT_ROWS, vocab, LONG.row, LONG.apart)


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
    """`steps` > 0. Train `model` in place: `steps` steps of the short phase, then `steps // 3`
    of the long one (AdamW, gradients clipped at 1); returns the copy accuracy on held-out
    long rows. Every `report_every` steps a progress line goes to `report`."""
    torch.manual_seed(seed)
    rng, start = random.Random(seed), time.perf_counter()
    held_out = {phase: copy_rows(random.Random(seed + 1), EVAL_ROWS, vocab, phase.row, phase.apart)
                for phase in (SHORT, LONG)}
    accuracy = 0.0
    for name, phase, n in (("short rows", SHORT, steps), ("long rows", LONG, steps // 3)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=phase.lr, betas=(0.9, 0.98))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(phase.warmup_steps, 1)))
        model.train()
        for step in range(1, n + 1):
            loss, _ = copy_loss(model, *copy_rows(rng, phase.batch, vocab, phase.row, phase.apart))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            if step % report_every == 0 or step == n:
                accuracy = held_out_accuracy(model, held_out[phase])
                report(f"copy pretraining, {name}: step {step}/{n}, loss {loss.item():.3f}, held-out copy accuracy "
                       f"{accuracy:.3f} ({time.perf_counter() - start:.0f}s)")
    return accuracy


def held_out_accuracy(model, held_out: tuple[torch.Tensor, torch.Tensor]) -> float:
    model.eval()
    with torch.no_grad():
        _, accuracy = copy_loss(model, *held_out)
    model.train()
    return accuracy
