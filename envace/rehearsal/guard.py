"""The guard: every high-risk call is rehearsed from the real history before it runs.

A verdict rests on two things the episode can know without privileged facts: REHEARSE's
prediction of the call's response given the real calls and responses so far (greedy),
and the tool's machine-checkable preconditions evaluated on those responses
(`Precondition.check`). The call is held when the rehearsed response is an error, when
it cannot be read (fail closed), or when a precondition is shown false.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal

from envace.domains.base import Precondition, Task, error_response, is_error
from envace.roles import Failure, parse_rehearse
from envace.rollout.runner import Episode, Policy


@dataclass
class Verdict:
    call: dict
    rehearsed: Any  # the predicted response, or None when REHEARSE's output did not parse
    broken: list[str] = field(default_factory=list)  # preconditions the history shows false
    undecided: list[str] = field(default_factory=list)  # preconditions the history cannot decide
    hold: bool = False
    reason: str = ""
    confirmed: bool = False  # held, then a person confirmed it: it ran

    def response(self) -> dict:
        """What ACT is told of a held call: the rehearsed error, else why it was held."""
        if is_error(self.rehearsed):
            return self.rehearsed
        return error_response("held", self.reason)

    def to_dict(self) -> dict:
        return asdict(self)


def history(messages: list[dict]) -> list[tuple[dict, Any]]:
    """The (call, response) pairs an episode has seen, in order; a held call saw none."""
    pending, out = [], []
    for m in messages:
        if m["role"] == "act" and "calls" in m:
            pending = list(m["calls"])
        elif m["role"] == "tool" and pending:
            call = pending.pop(0)
            if m.get("source") != "guard":
                out.append((call, m["response"]))
    return out


def preconditions_of(task: Task, name: str) -> tuple[Precondition, ...]:
    """The tool's preconditions: the domain's checkable ones, else the prose the task declares."""
    from envace.domains import get_domain

    try:
        tool = next((t for t in get_domain(task.domain).tools if t.name == name), None)
    except KeyError:
        tool = None
    if tool is not None:
        return tool.preconditions
    schema = next((t for t in task.tools if t["function"]["name"] == name), {})
    return tuple(Precondition(text) for text in schema.get("preconditions", []))


def is_high_risk(task: Task, name: str) -> bool:
    return any(t["function"]["name"] == name and t.get("risk") == "high" for t in task.tools)


def review(policy: Policy, cases: list[tuple[Task, list[tuple[dict, Any]], dict]], max_new_tokens: int,
           rehearse: bool = True, preconditions: bool = True) -> list[Verdict]:
    """A verdict per (task, real history, high-risk call), the rehearsals generated in one batch."""
    return judge(cases, rehearse_calls(policy, cases, max_new_tokens) if rehearse else None, preconditions)


def rehearse_calls(policy: Policy, cases: list[tuple[Task, list[tuple[dict, Any]], dict]],
                   max_new_tokens: int) -> list[Any]:
    """REHEARSE's greedy prediction of each case's response, in one batch (None: unreadable)."""
    if not cases:
        return []
    prompts = [policy.encode(policy.template.rehearse(task.tools, task.request,
                                                      [(c, None, r) for c, r in seen] + [(call, None, None)], train=False))
               for task, seen, call in cases]
    rehearsed: list[Any] = []
    for ids in policy.generate(prompts, max_new_tokens, 0.0, 1.0):
        ok = ids is not None and ids and ids[-1] == policy.stop_id
        parsed = parse_rehearse(policy.decode(ids), policy.template.end) if ok else Failure("unreadable", "")
        rehearsed.append(None if isinstance(parsed, Failure) else parsed)
    return rehearsed


def judge(cases: list[tuple[Task, list[tuple[dict, Any]], dict]], rehearsed: list[Any] | None,
          preconditions: bool = True) -> list[Verdict]:
    """The verdicts on `rehearsed` (`rehearse_calls`'s; None: the guard without its rehearsal) and,
    with `preconditions`, on the preconditions the history decides."""
    verdicts = []
    for i, (task, seen, call) in enumerate(cases):
        predicted = {} if rehearsed is None else rehearsed[i]
        verdict = Verdict(call, predicted)
        for p in preconditions_of(task, call["name"]):
            holds = p.check(call, seen) if preconditions else None
            if holds is False:
                verdict.broken.append(p.text)
            elif holds is None:
                verdict.undecided.append(p.text)
        reasons = [f"precondition false: {text}" for text in verdict.broken]
        if rehearsed is not None and predicted is None:
            reasons.append("its rehearsal could not be read (fail closed)")
        elif rehearsed is not None and is_error(predicted):
            code = predicted["error"].get("code", "error") if isinstance(predicted["error"], dict) else "error"
            reasons.append(f"rehearsed outcome: {code}")
        verdict.hold, verdict.reason = bool(reasons), "; ".join(reasons)
        verdicts.append(verdict)
    return verdicts


class Guard:
    """Screens the high-risk calls of real episodes (the runner's `guard`). A held call waits
    for `confirm(episode, verdict)` when given (True: it runs); otherwise it is held, and
    with `on_hold: ask` its episode ends there, waiting for a person."""

    def __init__(self, policy: Policy, max_new_tokens: int, on_hold: Literal["ask", "revise"] = "revise",
                 confirm: Callable[[Episode, Verdict], bool] | None = None, rehearse: bool = True,
                 preconditions: bool = True):
        if on_hold not in ("ask", "revise"):
            raise ValueError(f"guard on_hold must be 'ask' or 'revise', not {on_hold!r}")
        self.policy, self.max_new_tokens, self.confirm = policy, max_new_tokens, confirm
        self.stops_episode = on_hold == "ask"
        self.rehearse, self.preconditions = rehearse, preconditions

    def screen(self, requests: list[tuple[Episode, dict]]) -> list[dict | None]:
        risky = [i for i, (e, c) in enumerate(requests) if is_high_risk(e.task, c["name"])]
        verdicts = review(self.policy, [(requests[i][0].task, history(requests[i][0].messages), requests[i][1])
                                        for i in risky], self.max_new_tokens, self.rehearse, self.preconditions)
        out: list[dict | None] = [None] * len(requests)
        for i, verdict in zip(risky, verdicts):
            episode = requests[i][0]
            if verdict.hold and self.confirm is not None and self.confirm(episode, verdict):
                verdict.confirmed = True
            episode.reviews.append(verdict)
            if verdict.hold and not verdict.confirmed:
                index = sum(e is episode for e, _ in requests[:i])  # the call's place in its turn
                episode.messages[-1].setdefault("held", []).append(index)
                out[i] = verdict.response()
        return out
