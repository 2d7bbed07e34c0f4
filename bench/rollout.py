"""Generated tokens/s: our batched KV-cache generation vs transformers `generate`, same model.

Run: `.venv/bin/python bench/rollout.py [--model models/warmup]` (default: the embedded
default architecture from params.yaml with random weights and the prepared tokenizer).
Both sides decode greedily for exactly `new` tokens from the same left-padded prompts of
uneven length; each cell is timed alternately (ours, HF, ours, HF, ...) and the median of
`--repeats` runs is reported, so the ratio holds when the machine's speed drifts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(20, vocab) for _ in range(rng.randint(length // 2, length))] for _ in range(batch)]


def ours(model, prompts, new):
    from envace.rollout.generate import generate

    return generate(model, prompts, new, stop_id=-1, pad_id=0)


def hf(model, prompts, new):
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0, eos_token_id=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a saved checkpoint dir (default: embedded default, random weights)")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--lengths", default="64,160", help="max prompt lengths")
    parser.add_argument("--new", type=int, default=32, help="tokens generated per sequence")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    torch.set_num_threads(2)
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
    print(f"{'batch':>5} {'prompt':>6} {'ours tok/s':>11} {'HF tok/s':>9} {'ours/HF':>8}")
    for batch in map(int, args.batches.split(",")):
        for length in map(int, args.lengths.split(",")):
            prompts = _prompts(batch, length, vocab, seed=batch * 1000 + length)
            with torch.no_grad():
                ours(model, prompts[:1], 2), hf(model, prompts[:1], 2)  # warm-up
                times = {"ours": [], "hf": []}
                for _ in range(args.repeats):
                    for name, fn in (("ours", ours), ("hf", hf)):
                        start = time.perf_counter()
                        fn(model, prompts, args.new)
                        times[name].append(time.perf_counter() - start)
            tok = batch * args.new
            a, b = tok / statistics.median(times["ours"]), tok / statistics.median(times["hf"])
            print(f"{batch:>5} {length:>6} {a:>11.0f} {b:>9.0f} {a / b:>8.2f}")


if __name__ == "__main__":
    main()
