"""Can the embedded model learn to copy in order? Copy pretraining from scratch, per variant.

Trains a fresh embedded model (params.yaml's `model`, with each variant's overrides) on the
copy rows of `envace.model.copying` — 64 random tokens of the project's vocabulary: filler,
a span of 8 to 28 tokens, the span again — and prints the next-token accuracy on the
repeats of 256 held-out rows every 100 steps. A model that copies in order (an induction
circuit: find the token just written earlier in the row, copy the one after it) gets them
right whatever the span and wherever it sits; a model that does not stays near chance.
`model.copy_steps` runs the same training in `base_model`. Needs the project's tokenizer
(`prepare`); run it from the project's root:

    .venv/bin/python bench/induction.py
    cd examples/gitforge && ../../.venv/bin/python ../../bench/induction.py --steps 3000
    .venv/bin/python bench/induction.py --variants "num_heads=4" "hidden_size=256"
"""

from __future__ import annotations

import argparse

from envace.config import load_params
from envace.model import build_default
from envace.paths import TOKENIZER


def main() -> None:
    from transformers import PreTrainedTokenizerFast

    from envace.model.copying import copy_vocab, pretrain_copying

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--variants", nargs="+", default=[""],
                        help="model-config overrides, one variant each: key=value[,key=value] ('' = params.yaml)")
    args = parser.parse_args()
    params = load_params()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(TOKENIZER)
    results = {}
    for variant in args.variants:
        overrides = {k: type(getattr(params.model, k))(v) for k, v in (kv.split("=") for kv in variant.split(",") if kv)}
        print(f"{variant or 'params.yaml model'}:", flush=True)
        model = build_default(params.model.model_copy(update=overrides), tokenizer)
        results[variant] = pretrain_copying(model, copy_vocab(tokenizer), args.steps, params.model.seed, report_every=100,
                                            report=lambda line: print(f"  {line}", flush=True))
    print(f"\nin-order copy accuracy after {args.steps} steps (chance ~{1 / len(tokenizer):.4f})")
    for variant, accuracy in results.items():
        print(f"  {variant or 'params.yaml model':30s} {accuracy:.3f}")


if __name__ == "__main__":
    main()
