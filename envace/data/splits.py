"""Deterministic train/val/test splits that share no task id, request or scenario.

Episodes that share any of these keys are grouped (union-find), and each group goes to
one split chosen by a seeded hash of its smallest task id — so the split of every episode
is the same however the log is ordered.
"""

from __future__ import annotations

import hashlib
import json

def spread(items: list, n: int) -> list:
    """`n` items evenly spaced through `items` (all of them when n is 0 or too large):
    the splits are ordered by domain, so every domain stays represented."""
    if not n or n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(n)]


def scenario_key(scenario) -> str:
    return hashlib.sha1(json.dumps(scenario, sort_keys=True).encode()).hexdigest()[:16]


def _groups(episodes: list[dict]) -> list[int]:
    parent = list(range(len(episodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_seen: dict[tuple, int] = {}
    for i, ep in enumerate(episodes):
        task = ep["task"]
        keys = [("id", task["id"]), ("request", task["request"])]
        if task["scenario"]:  # imported logs may have none: an empty scenario ties nothing together
            keys.append(("scenario", scenario_key(task["scenario"])))
        for key in keys:
            j = first_seen.setdefault(key, i)
            parent[find(i)] = find(j)
    return [find(i) for i in range(len(episodes))]


def assign_splits(episodes: list[dict], val_fraction: float, test_fraction: float, seed: int) -> list[str]:
    """The split of each episode, in order."""
    roots = _groups(episodes)
    smallest: dict[int, str] = {}
    for root, ep in zip(roots, episodes):
        smallest[root] = min(smallest.get(root, ep["task"]["id"]), ep["task"]["id"])
    out = []
    for root in roots:
        digest = hashlib.sha256(f"{seed}:{smallest[root]}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        out.append("test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train")
    return out
