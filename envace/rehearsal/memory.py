"""Imagined episodes (private rehearsal) and the rehearsal memory they condense into.

The memory is short, so a small model can use it: at most `limit` imagined episodes, each
as its plan (`roles.plan_text`: what it looked up before its first irreversible call or
its answer, without values); episodes with the same plan are one entry. The entry ACT
should follow comes first (ACT is trained to follow the first: `envace.train.memory`),
ranked by what can be judged without the real environment:
1. it ended with an answer (no failed step);
2. nothing went wrong on an irreversible call: every high-risk call was preceded by the
   lookups that decide its checkable preconditions, and none was rehearsed as an error;
3. it looked more up before answering (more low-risk calls);
4. parallel: the more frequent way; sequential: the later episode (it had seen the others).
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from envace.config import RolloutConfig
from envace.domains.base import Task, is_error
from envace.rehearsal.guard import history, is_high_risk, preconditions_of
from envace.roles import plan_text
from envace.rollout.generate import mix64
from envace.rollout.runner import Episode, EpisodeRunner, ModelResponder, Policy

PRIVATE = 0x5EC2E7  # salt: the random streams of private rehearsal, apart from any other


def imagined_messages(episode: Episode) -> list[dict]:
    """An imagined episode as a memory entry: its messages after the request."""
    return [m for m in episode.messages[1:] if m["role"] in ("act", "tool", "failed_step")]


def went_wrong(task: Task, messages: list[dict]) -> tuple[bool, bool, int]:
    """(failed, an irreversible call unverified or rehearsed as an error, low-risk calls made)."""
    failed = not messages or any(m["role"] == "failed_step" for m in messages) or "answer" not in messages[-1]
    made: list[dict] = []
    risky_wrong, lookups = False, 0
    for call, response in history(messages):
        if is_high_risk(task, call["name"]):
            needed = [p.evidence_call(call["arguments"]) for p in preconditions_of(task, call["name"]) if p.checkable]
            risky_wrong |= is_error(response) or any(c is not None and c not in made for c in needed)
        else:
            lookups += 1
        made.append(call)
    return failed, risky_wrong, lookups


def condense(episodes: list[Episode], limit: int, mode: Literal["parallel", "sequential"] = "parallel") -> list[list[dict]]:
    """The rehearsal memory of `episodes`: up to `limit` distinct imagined episodes, the one to
    follow first (see the module's ranking)."""
    entries = [imagined_messages(e) for e in episodes]
    plans = [plan_text(m, e.task.tools) for m, e in zip(entries, episodes)]
    counts = Counter(plans)

    def rank(i: int) -> tuple:
        failed, risky_wrong, lookups = went_wrong(episodes[i].task, entries[i])
        tie = -i if mode == "sequential" else -counts[plans[i]]
        return failed, risky_wrong, -lookups, tie, i

    memory, seen = [], set()
    for i in sorted(range(len(entries)), key=rank):
        if plans[i] not in seen and len(memory) < limit:
            seen.add(plans[i])
            memory.append(entries[i])
    return memory


def imagine(policy: Policy, tasks: list[Task], rollout: RolloutConfig, budget: int,
            mode: Literal["parallel", "sequential"] = "parallel", memory_episodes: int = 2,
            temperature: float = 1.0, seed: int = 0, first: list[Episode] | None = None) -> list[list[Episode]]:
    """`budget` imagined episodes per task: ACT and REHEARSE of `policy`, no privileged facts,
    no backend (zero real calls). Imagined episode k of task i samples from the stream
    (seed, i, k) in either mode, so the first is the same in both and a smaller budget's
    episodes are the first of a larger one's. `first`: each task's first imagined episode,
    already played (by either mode); only the others are played."""
    if budget <= 0 or not tasks:
        return [[] for _ in tasks]
    responder = ModelResponder(policy, rollout, "rehearsed", temperature, privileged=False)
    runner = EpisodeRunner(policy, responder, rollout, temperature=temperature)
    stream = lambda i, k: mix64(seed, PRIVATE, i, k)  # noqa: E731
    chains: list[list[Episode]] = [[e] for e in first] if first else [[] for _ in tasks]
    begin = len(chains[0])
    if mode == "parallel":
        per_task = budget - begin
        flat = runner.run([t for t in tasks for _ in range(per_task)],
                          [stream(i, k) for i in range(len(tasks)) for k in range(begin, budget)])
        return [chain + flat[i * per_task:(i + 1) * per_task] for i, chain in enumerate(chains)]
    for k in range(begin, budget):
        memories = [condense(chain, memory_episodes, "sequential") or None for chain in chains]
        for chain, episode in zip(chains, runner.run(tasks, [stream(i, k) for i in range(len(tasks))], memories)):
            chain.append(episode)
    return chains
