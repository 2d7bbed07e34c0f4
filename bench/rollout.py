"""Generated tokens/s: our batched generation (lean decoder, and the model's own forward with
its KV cache) vs transformers `generate`, same model.

Run: `.venv/bin/python bench/rollout.py [--model models/warmup]` (default: the embedded
default architecture from params.yaml with random weights and the prepared tokenizer).
Every side decodes greedily for exactly `new` tokens from the same left-padded prompts of
uneven length; each cell is timed in turn (lean, forward, HF, lean, ...) and the median of
`--repeats` runs is reported, so the ratios hold when the machine's speed drifts. Also timed:
one new token only (the prefill), which gives the prefill's share of HF's time, the prefills'
ratio and the decode steps' ratio alone. Writes the lean/HF ratio per batch size (at the first prompt length) to
`metrics/bench_rollout.json`. `--share 8`: prompts in groups of 8 that begin alike, as a GRPO
group's do (the lean prefill computes a shared beginning once; printed, not written).
`--threads 1`: one torch thread (e.g. pinned by `taskset` beside another job); the target is for 2.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time
from pathlib import Path

import torch


def _prompts(batch: int, length: int, vocab: int, seed: int, share: int = 1) -> list[list[int]]:
    """Random prompts of half to all of `length` tokens; with `share` > 1, rows come in groups of
    `share` that begin alike for half to three quarters of their length (as a GRPO group's
    episodes of one task do), each row's own tokens after."""
    rng = random.Random(seed)
    word = lambda: rng.randrange(20, vocab)  # noqa: E731
    prompts = []
    for _ in range(0, batch, share):
        beginning = [word() for _ in range(rng.randint(length // 2, length * 3 // 4))] if share > 1 else []
        prompts += [beginning + [word() for _ in range(rng.randint(length // 2, length) - len(beginning))]
                    for _ in range(share)]
    return prompts[:batch]


def ours(model, prompts, new, lean: bool):
    from envace.rollout.generate import generate

    return generate(model, prompts, new, stop_id=-1, pad_id=0, lean=lean)


def hf(model, prompts, new):
    from envace.rollout.generate import left_padded

    ids, mask, _ = left_padded(prompts, 0)
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0, eos_token_id=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a saved checkpoint dir (default: embedded default, random weights)")
    parser.add_argument("--batches", default="1,64,128")
    parser.add_argument("--lengths", default="160,64", help="max prompt lengths")
    parser.add_argument("--new", type=int, default=32, help="tokens generated per sequence")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--share", type=int, default=1,
                        help="rows per group of prompts that begin alike (8: like GRPO's groups; 1: none, the target's bench)")
    parser.add_argument("--out", default="metrics/bench_rollout.json", help="where the ratios go ('' = nowhere)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2: the target's machine)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    if args.model:
        from envace.model import load

        model, _ = load(args.model)
    else:
        from transformers import PreTrainedTokenizerFast

        from envace.config import load_params
        from envace.model import build_default

        tok_dir = Path("data/prepared/tokenizer")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tok_dir)
        model = build_default(load_params("params.yaml").model, tokenizer)
    model.eval()
    vocab = model.config.vocab_size
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, {args.new} new tokens per sequence, "
          f"median of {args.repeats}")
    print(f"{'batch':>5} {'prompt':>6} {'lean tok/s':>11} {'forward tok/s':>14} {'HF tok/s':>9} {'lean/HF':>8} "
          f"{'forward/HF':>11} {'HF prefill':>11} {'prefill lean/HF':>16} {'decode lean/HF':>15}")
    lean, forward = functools.partial(ours, lean=True), functools.partial(ours, lean=False)
    runs = [("lean", lean, args.new), ("forward", forward, args.new), ("hf", hf, args.new), ("lean", lean, 1), ("hf", hf, 1)]
    ratios = {}
    for batch in map(int, args.batches.split(",")):
        for length in map(int, args.lengths.split(",")):
            prompts = _prompts(batch, length, vocab, seed=batch * 1000 + length, share=args.share)
            times = {(name, new): [] for name, _, new in runs}
            with torch.no_grad():
                for _, fn, _ in runs[:3]:
                    fn(model, prompts[:1], 2)  # warm-up
                for _ in range(args.repeats):
                    for name, fn, new in runs:
                        start = time.perf_counter()
                        fn(model, prompts, new)
                        times[name, new].append(time.perf_counter() - start)
            t = {key: statistics.median(v) for key, v in times.items()}
            full = {name: t[name, args.new] for name in ("lean", "forward", "hf")}
            ratios.setdefault(str(batch), round(full["hf"] / full["lean"], 3))
            # one generated token is the prefill (and one sampling); the rest is the decode steps
            decode = (full["hf"] - t["hf", 1]) / max(full["lean"] - t["lean", 1], 1e-9)
            print(f"{batch:>5} {length:>6} {batch * args.new / full['lean']:>11.0f} {batch * args.new / full['forward']:>14.0f} "
                  f"{batch * args.new / full['hf']:>9.0f} {full['hf'] / full['lean']:>8.2f} {full['hf'] / full['forward']:>11.2f} "
                  f"{t['hf', 1] / full['hf']:>11.0%} {t['hf', 1] / t['lean', 1]:>16.2f} {decode:>15.2f}")
    if args.out and args.share > 1:
        print(f"not written to {args.out}: its ratios are for prompts that share nothing (--share 1)")
    elif args.out:
        from envace.io import write_json

        write_json(args.out, {"ratio": ratios})
        print(f"wrote {args.out}: lean/HF at prompt length {args.lengths.split(',')[0]}")

if __name__ == "__main__":
    main()
