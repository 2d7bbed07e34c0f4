"""ACT's success in the real environment: greedy episodes on held-out tasks, real backends."""

from __future__ import annotations

from collections import defaultdict

from envace.config import RolloutConfig
from envace.domains.base import Task
from envace.evaluate import success_rates
from envace.rollout.runner import EpisodeRunner, RealResponder


def real_success(policy, tasks: list[Task], cfg: RolloutConfig, temperature: float = 0.0) -> dict:
    episodes = EpisodeRunner(policy, RealResponder(), cfg, temperature=temperature).run(tasks)
    failures: dict[str, int] = defaultdict(int)
    for e in episodes:
        if e.failure:
            failures[e.failure] += 1
    rates = success_rates((e.task.domain, e.task.task_type, e.success) for e in episodes)
    return {
        "success": rates["overall"],
        "n": len(episodes),
        "per_domain": rates["per_domain"],
        "per_task_type": rates["per_task_type"],
        "failed_steps": dict(sorted(failures.items())),
        "real_calls": sum(e.real_calls for e in episodes),
    }
