"""Rehearsal accuracy, teacher-forced on held-out real trajectories.

For every recorded call, REHEARSE predicts the response from the true history (greedy);
we compare it with the real response: exact match after JSON canonicalisation, and
field-level accuracy (share of leaf fields equal), per tool and overall, with or without
the privileged scenario facts; and the share of predictions that parse (one JSON object
closed by the stop token).
"""

from __future__ import annotations

from collections import defaultdict

from envace.roles import Failure, canonical, parse_rehearse
from envace.data.episodes import fact_source, recorded_calls


def leaves(obj, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} → {"a.b": "1"} (values canonicalised)."""
    if isinstance(obj, dict) and obj:
        return {k: v for key, val in obj.items() for k, v in leaves(val, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): canonical(obj)}


def field_accuracy(predicted, real) -> float:
    """Share of the leaf fields of either side that agree.

    >>> field_accuracy({"a": 1, "b": 2}, {"a": 1, "b": 3})
    0.5
    """
    p, r = leaves(predicted), leaves(real)
    keys = set(p) | set(r)
    return sum(p.get(k) == r.get(k) for k in keys) / len(keys) if keys else 1.0


def rehearsal_prompts(policy, episodes: list[dict], privileged: bool) -> list[tuple[str, list[int], object]]:
    """(tool name, prompt ids, real response) for every recorded call: REHEARSE's prompt given
    the true history, with the privileged facts or without."""
    items = []
    for ep in episodes:
        task, recorded = ep["task"], recorded_calls(ep)
        facts = fact_source(task)
        shown = [facts.facts(c) if privileged else None for c, _ in recorded]
        for k, (call, real) in enumerate(recorded):
            steps = [(c, f, r) for (c, r), f in zip(recorded[:k], shown)] + [(call, shown[k], None)]
            prompt = policy.encode(policy.template.rehearse(task["tools"], task["request"], steps, train=False))
            items.append((call["name"], prompt, real))
    return items


def rehearsed(policy, prompts: list[list[int]], max_new_tokens: int = 96, batch_size: int = 128) -> list:
    """Each prompt's greedy rehearsal, parsed; a Failure where it does not parse or never stops.
    Batches are cut from the prompts sorted by length: a batch's rows pad to its longest
    prompt in the prefill and in every decode step's cache read."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outputs: list = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        for i, ids in zip(batch, policy.generate([prompts[i] for i in batch], max_new_tokens, 0.0, 1.0, None)):
            text = policy.decode(ids) if ids is not None else ""
            stopped = ids and ids[-1] == policy.stop_id
            outputs[i] = parse_rehearse(text, policy.template.end) if stopped else Failure("", text)
    return outputs


def rehearsal_accuracy(policy, episodes: list[dict], privileged: bool, max_new_tokens: int = 96,
                       batch_size: int = 128) -> dict:
    items = rehearsal_prompts(policy, episodes, privileged)
    per_tool: dict[str, list[tuple[bool, float, bool]]] = defaultdict(list)  # (exact, field, parsed)
    for (tool, _, real), predicted in zip(items, rehearsed(policy, [p for _, p, _ in items], max_new_tokens, batch_size)):
        if isinstance(predicted, Failure):
            per_tool[tool].append((False, 0.0, False))
        else:
            per_tool[tool].append((canonical(predicted) == canonical(real), field_accuracy(predicted, real), True))
    everything = [x for results in per_tool.values() for x in results]
    mean = lambda xs: round(sum(xs) / len(xs), 4) if xs else 0.0  # noqa: E731
    return {
        "exact": mean([e for e, _, _ in everything]),
        "field": mean([f for _, f, _ in everything]),
        "parse_rate": mean([ok for _, _, ok in everything]),
        "n": len(everything),
        "per_tool": {tool: {"exact": mean([e for e, _, _ in rs]), "field": mean([f for _, f, _ in rs]), "n": len(rs)}
                     for tool, rs in sorted(per_tool.items())},
    }
