"""Test-time private rehearsal and the guard before irreversible actions.

Before it acts for real, the trained model rehearses privately: N imagined episodes of the
task, ACT and REHEARSE of the same weights, no privileged facts and zero real calls
(`imagine`). *Parallel* rehearsal samples them independently; *sequential* rehearsal shows
episode k a memory of episodes 1..k-1. The imagined episodes are condensed into a
rehearsal memory (`condense`): the few distinct plans tried (what each looked up before
acting, and which lookups were rehearsed as errors), the one to follow first — judged by
where the others went wrong. ACT reads it before the request in the real episode
(`envace.roles`); the `envace` variant is taught to (`envace.train.memory`, then GRPO
groups that play with a memory of their siblings' private rehearsals).

During the real episode the guard (`Guard`) screens every high-risk call ACT proposes:
REHEARSE predicts its response from the real history (no privileged facts), and the
tool's machine-checkable preconditions are evaluated on the responses the episode has
seen. A rehearsed error, an unreadable rehearsal (fail closed) or a broken precondition
holds the call: it is not executed, the episode records it with its rehearsed outcome,
and it either waits for a person's confirmation (`on_hold: ask`) or goes back to ACT to
revise (`on_hold: revise`).
"""

from __future__ import annotations

from typing import Callable, Literal

from envace.config import RolloutConfig
from envace.domains.base import Task, is_error
from envace.rehearsal.guard import Guard, Verdict, review
from envace.rehearsal.memory import condense, imagine
from envace.rollout.runner import Episode, EpisodeRunner, Policy, RealResponder, Responder

Mode = Literal["parallel", "sequential"]
__all__ = ["Guard", "Verdict", "review", "condense", "imagine", "play"]


def play(policy: Policy, tasks: list[Task], rollout: RolloutConfig, budget: int = 0, mode: Mode = "parallel",
         guard: Guard | None = None, memory_episodes: int = 2, temperature: float = 1.0, seed: int = 0,
         responder: Responder | None = None, on_imagined: Callable[[int, list[Episode]], None] | None = None
         ) -> tuple[list[Episode], list[list[Episode]]]:
    """Rehearse each task privately `budget` times, then play it once for real (greedy) with
    the rehearsal memory in ACT's context and, with `guard`, every high-risk call screened.
    Returns (real episodes, imagined episodes per task). `on_imagined(k, episodes)` sees each
    task's imagined episodes before the real one starts (e.g. to show them to a person)."""
    imagined = imagine(policy, tasks, rollout, budget, mode, memory_episodes, temperature, seed)
    for k, episodes in enumerate(imagined):
        if on_imagined is not None:
            on_imagined(k, episodes)
    memories = [condense(episodes, memory_episodes, mode) or None for episodes in imagined]
    runner = EpisodeRunner(policy, responder or RealResponder(), rollout, temperature=0.0, guard=guard)
    return runner.run(tasks, memories=memories), imagined


def harmful_executed(episode: Episode) -> int:
    """High-risk calls that ran in the real backend and that it rejected (harmful attempts)."""
    high = {t["function"]["name"] for t in episode.task.tools if t.get("risk") == "high"}
    return sum(m["role"] == "tool" and m.get("source") == "real" and m["name"] in high and is_error(m["response"])
               for m in episode.messages)
