"""ACT's success in the real environment: greedy episodes on held-out tasks, real backends."""

from __future__ import annotations

from collections import defaultdict

from envace.config import RolloutConfig
from envace.domains.base import Task
from envace.rollout.runner import EpisodeRunner, RealResponder


def real_success(policy, tasks: list[Task], cfg: RolloutConfig, temperature: float = 0.0) -> dict:
    episodes = EpisodeRunner(policy, RealResponder(), cfg, temperature=temperature).run(tasks)
    groups: dict[str, list[bool]] = defaultdict(list)
    failures: dict[str, int] = defaultdict(int)
    for e in episodes:
        groups["overall"].append(e.success)
        groups[e.task.domain].append(e.success)
        groups[f"{e.task.domain}/{e.task.task_type}"].append(e.success)
        if e.failure:
            failures[e.failure] += 1
    rate = {k: round(sum(v) / len(v), 4) for k, v in groups.items()}
    return {
        "success": rate.pop("overall"),
        "n": len(episodes),
        "per_domain": {k: v for k, v in rate.items() if "/" not in k},
        "per_task_type": {k: v for k, v in rate.items() if "/" in k},
        "failed_steps": dict(sorted(failures.items())),
        "real_calls": sum(e.real_calls for e in episodes),
    }
