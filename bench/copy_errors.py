"""What REHEARSE gets wrong, and whether the model has the head an in-order copy needs.

For a trained checkpoint, on the test split's recorded calls with their privileged facts
(the rehearsal gate's setting), prints:

1. Every missed response by kind, per tool: a value of several words (a title, a
   `prefix/topic` branch, an `owner/name-suffix` repo) with its own words in another order;
   words taken from another value of the response; more or fewer values than the real
   response; the values right and another field wrong; anything else (numbers, unparsed).
2. Previous-token attention: for each layer and head, the mean attention weight from a token
   to the one just before it, over whole REHEARSE conversations. Copying several tokens in
   order needs such a head (with a second-layer head reading it, an induction circuit: find
   the token just written in the facts, copy the one after it). Without one, a model can copy
   which words a value has, but not in which order.

Run from a project's root after its warmup:

    cd examples/gitforge && ../../.venv/bin/python ../../bench/copy_errors.py models/warmup
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

import torch

from envace.config import load_params
from envace.domains import use_domains
from envace.evaluate.rehearsal import rehearsal_prompts, rehearsed
from envace.io import read_jsonl
from envace.roles import Failure, canonical

WORD_BREAK = re.compile(r"[ /\-]")


def strings(obj) -> list[str]:
    """The string values of a response, in order."""
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in strings(v)]
    return [obj] if isinstance(obj, str) else []


def miss_kind(predicted, real) -> str:
    if isinstance(predicted, Failure):
        return "unparsed"
    said, truth = strings(predicted), strings(real)
    if len(said) != len(truth):
        return "another number of values"
    if said == truth:
        return "values right, another field wrong"
    words = lambda s: WORD_BREAK.split(s)  # noqa: E731
    if all(sorted(words(a)) == sorted(words(b)) for a, b in zip(said, truth)):
        return "a value's own words, another order"
    every_word = {w for s in truth for w in words(s)}
    if all(set(words(a)) <= every_word for a in said):
        return "words from another value"
    return "other"


def miss_kinds(policy, episodes: list[dict]) -> dict[str, Counter]:
    items = rehearsal_prompts(policy, episodes, privileged=True)
    kinds: dict[str, Counter] = {}
    for (tool, _, real), predicted in zip(items, rehearsed(policy, [p for _, p, _ in items])):
        right = not isinstance(predicted, Failure) and canonical(predicted) == canonical(real)
        kinds.setdefault(tool, Counter())["exact" if right else miss_kind(predicted, real)] += 1
    return kinds


def previous_token_attention(path: str, policy, episodes: list[dict], skip: int = 60) -> torch.Tensor:
    """[layers, heads]: mean attention on the token before, over full conversations (after `skip` tokens)."""
    from transformers import AutoModelForCausalLM

    from envace.data.episodes import fact_source, recorded_calls

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    total = None
    for ep in episodes:
        task, recorded = ep["task"], recorded_calls(ep)
        facts = fact_source(task)
        steps = [(call, facts.facts(call), real) for call, real in recorded]
        ids = policy.encode(policy.template.rehearse(task["tools"], task["request"], steps, train=False))
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions
        rows = torch.arange(skip, len(ids))
        mean = torch.stack([a[0][:, rows, rows - 1].mean(-1) for a in attentions])
        total = mean if total is None else total + mean
    return total / len(episodes)


def main() -> None:
    from envace.rollout.runner import load_policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default="models/warmup")
    parser.add_argument("--attention-episodes", type=int, default=40)
    args = parser.parse_args()
    params = load_params()
    use_domains(params.collect.domains, ".", params.collect.real_backends)
    policy = load_policy(args.checkpoint, params.trainer, params.model.max_seq_len)
    policy.model.eval()
    test = list(read_jsonl("data/prepared/test.jsonl"))

    print(f"REHEARSE on the test split's calls, with facts ({args.checkpoint}):")
    for tool, kinds in sorted(miss_kinds(policy, test).items()):
        n = sum(kinds.values())
        misses = ", ".join(f"{k} {c}" for k, c in kinds.most_common() if k != "exact") or "none"
        print(f"  {tool:22s} exact {kinds['exact']}/{n}; misses: {misses}")

    attention = previous_token_attention(args.checkpoint, policy, test[: args.attention_episodes])
    print(f"\nattention on the previous token, per head ({args.attention_episodes} test conversations):")
    for layer, heads in enumerate(attention):
        print(f"  layer {layer}: " + " ".join(f"{w:.2f}" for w in heads.tolist()) + f"   (max {heads.max():.2f})")


if __name__ == "__main__":
    main()
