"""Evaluation against the real environment: rehearsal accuracy and real-task success."""

from __future__ import annotations

from collections import defaultdict


def success_rates(outcomes) -> dict:
    """(domain, task_type, success) triples → overall, per-domain and per-task-type rates."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for domain, task_type, ok in outcomes:
        for key in ("overall", domain, f"{domain}/{task_type}"):
            groups[key].append(bool(ok))
    rate = {k: round(sum(v) / len(v), 4) for k, v in groups.items()}
    return {
        "overall": rate.pop("overall"),
        "per_domain": {k: v for k, v in rate.items() if "/" not in k},
        "per_task_type": {k: v for k, v in rate.items() if "/" in k},
    }
