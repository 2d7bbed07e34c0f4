"""Evaluation against the real environment: rehearsal accuracy and real-task success."""

from __future__ import annotations

import math
from collections import defaultdict


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (sound near 0 and 1, unlike p ± z·se).

    >>> wilson(8, 10)
    (0.4902, 0.9433)
    >>> wilson(0, 0)
    (0.0, 1.0)
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)


def rate(outcomes: list[bool]) -> float:
    """A success rate as `metrics/eval.json` states it, to 4 places. The registry re-scores the
    champion and compares it with the challenger's rate from that file: both must be rounded
    alike, or the same 714 of 797 tasks reads 0.8959 for one and 0.89586 for the other.

    >>> rate([True] * 714 + [False] * 83), 714 / 797
    (0.8959, 0.8958594730238394)
    """
    return round(sum(outcomes) / len(outcomes), 4)


def success_rates(outcomes) -> dict:
    """(domain, task_type, success) triples → overall, per-domain and per-task-type rates."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for domain, task_type, ok in outcomes:
        for key in ("overall", domain, f"{domain}/{task_type}"):
            groups[key].append(bool(ok))
    rates = {k: rate(v) for k, v in groups.items()}
    return {
        "overall": rates.pop("overall"),
        "per_domain": {k: v for k, v in rates.items() if "/" not in k},
        "per_task_type": {k: v for k, v in rates.items() if "/" in k},
    }
