"""ACT's success in the real environment: greedy episodes on held-out tasks, real backends."""

from __future__ import annotations

from collections import defaultdict

from envace.config import RolloutConfig
from envace.domains.base import Task
from envace.evaluate import success_rates, wilson
from envace.roles import leaked
from envace.rollout.runner import ACT, EpisodeRunner, RealResponder


def backend_kind(tasks: list[Task]) -> str:
    """Which kind of real backend answers these tasks: python, mcp or none (joined with + if mixed)."""
    from envace.domains import get_domain

    return "+".join(sorted({get_domain(t.domain).backend_kind for t in tasks})) or "none"


def unavailable(tasks: list[Task]) -> str | None:
    """Why these tasks cannot be played for real (None when every one has a real backend)."""
    from envace.domains import get_domain

    missing = sorted({t.domain for t in tasks if get_domain(t.domain).backend is None})
    return f"no real backend for domain(s) {', '.join(missing)} (logs only)" if missing else None


def real_success(policy, tasks: list[Task], cfg: RolloutConfig, temperature: float = 0.0,
                 leak_words: frozenset[str] = frozenset(), subset: set[str] | None = None) -> dict:
    """Success rate (with its 95% Wilson interval), per domain and task type, turns and ACT
    tokens per task, the share of ACT outputs that parse (calls or an answer), failed steps,
    and the share of ACT outputs using one of `leak_words`; with `subset` (task ids), the same
    for those tasks' episodes under "subset"."""
    episodes = EpisodeRunner(policy, RealResponder(), cfg, temperature=temperature).run(tasks)
    out = summary(policy, episodes, leak_words)
    if subset:
        out["subset"] = summary(policy, [e for e in episodes if e.task.id in subset], leak_words)
    return out


def summary(policy, episodes: list, leak_words: frozenset[str]) -> dict:
    failures: dict[str, int] = defaultdict(int)
    for e in episodes:
        if e.failure:
            failures[e.failure] += 1
    rates = success_rates((e.task.domain, e.task.task_type, e.success) for e in episodes)
    successes, n = sum(e.success for e in episodes), len(episodes)
    act_outputs = [g.output_ids for e in episodes for g in e.generations if g.role == ACT]
    unparsed = sum(1 for e in episodes if (e.failure or "").startswith("act:"))  # each ends its episode
    ci_low, ci_high = wilson(successes, n)
    return {
        "success": rates["overall"], "ci_low": ci_low, "ci_high": ci_high, "n": n,
        "per_domain": rates["per_domain"],
        "per_task_type": rates["per_task_type"],
        "turns_per_task": round(len(act_outputs) / max(1, n), 3),
        "act_parse_rate": round(1 - unparsed / max(1, len(act_outputs)), 4),
        "act_tokens_per_task": round(sum(map(len, act_outputs)) / max(1, n), 1),
        "leak_rate": round(sum(leaked(policy.decode(ids), leak_words) for ids in act_outputs)
                           / max(1, len(act_outputs)), 4),
        "failed_steps": dict(sorted(failures.items())),
        "real_calls": sum(e.real_calls for e in episodes),
    }
