"""Can the embedded model learn to copy in order? Synthetic copies, trained from scratch.

Each row is 64 tokens drawn from the project's vocabulary: random filler, a span of 3 to
`--span` random tokens, more filler, then the same span again at the end. The loss is on the
repeat's tokens after its first; a model that copies in order (an induction head: find the
token just written earlier in the row, copy the one after it) gets them right, whatever the
span and wherever it sits. Prints next-token accuracy on the repeats of 256 fixed rows every
100 steps. Needs the project's tokenizer (`prepare`); run it from the project's root:

    .venv/bin/python bench/induction.py
    cd examples/gitforge && ../../.venv/bin/python ../../bench/induction.py --steps 2000 --lr 3e-3
    .venv/bin/python bench/induction.py --variants "num_layers=3" "hidden_size=256"
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from envace.config import load_params
from envace.model import build_default
from envace.paths import TOKENIZER

ROW = 64


def rows(rng: random.Random, n: int, vocab: range, longest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask): `n` rows ending in a repeated span; mask marks the repeat's tokens after its first."""
    ids, mask = [], []
    for _ in range(n):
        span = [rng.choice(vocab) for _ in range(rng.randint(3, longest))]
        filler = [rng.choice(vocab) for _ in range(ROW - 2 * len(span))]
        cut = rng.randint(0, len(filler))
        ids.append(filler[:cut] + span + filler[cut:] + span)
        mask.append([False] * (ROW - len(span) + 1) + [True] * (len(span) - 1))
    return torch.tensor(ids), torch.tensor(mask)


def copy_loss(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Cross-entropy on the masked next tokens (logits only where needed), and their accuracy."""
    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1][mask[:, 1:]]
    logits, target = model.lm_head(hidden), ids[:, 1:][mask[:, 1:]]
    return torch.nn.functional.cross_entropy(logits, target), (logits.argmax(-1) == target).float().mean().item()


def train(overrides: dict, args, params) -> list[tuple[int, float]]:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(TOKENIZER)
    model = build_default(params.model.model_copy(update=overrides), tokenizer)
    vocab = range(len(tokenizer.all_special_tokens), len(tokenizer))
    held_out = rows(random.Random(1), 256, vocab, args.span)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    rng, curve, start = random.Random(0), [], time.perf_counter()
    for step in range(1, args.steps + 1):
        loss, _ = copy_loss(model, *rows(rng, args.batch, vocab, args.span))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            with torch.no_grad():
                _, accuracy = copy_loss(model.eval(), *held_out)
            model.train()
            curve.append((step, accuracy))
            print(f"  step {step}: loss {loss.item():.3f}, copy accuracy {accuracy:.3f} "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--span", type=int, default=16, help="longest repeated span (tokens)")
    parser.add_argument("--variants", nargs="+", default=[""],
                        help="model-config overrides, one variant each: key=value[,key=value] ('' = params.yaml)")
    args = parser.parse_args()
    params = load_params()
    results = {}
    for variant in args.variants:
        overrides = {k: type(getattr(params.model, k))(v) for k, v in (kv.split("=") for kv in variant.split(",") if kv)}
        print(f"{variant or 'params.yaml model'}:", flush=True)
        results[variant] = train(overrides, args, params)
    print(f"\nin-order copy accuracy after {args.steps} steps (chance ~0)")
    for variant, curve in results.items():
        print(f"  {variant or 'params.yaml model':30s} {curve[-1][1]:.3f} (best {max(a for _, a in curve):.3f})")


if __name__ == "__main__":
    main()
