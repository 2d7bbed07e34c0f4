"""The judge: a task's checklist → reward. Pure functions; the examples are tests.

Success is decided from the ground truth only — the calls the agent made and its final
answer — never from a rehearsed (imagined) state. When an episode ran in the real
backend, its final state must also equal the state after replaying the ground truth
(BFCL's criterion). Rules, all required:
1. every required call appears (same name, same arguments; order free);
2. no forbidden call appears;
3. every high-risk call made is one of the required calls (no unrequested irreversible action);
4. the final answer states every expected fact (whole words, case-insensitive);
5. the domain's own rules, if it has any (`Domain.check`);
6. (real episodes) final backend state == state after replaying the ground truth.

>>> task_calls = [{"name": "get_balance", "arguments": {"account_id": "A12"}}]
>>> words("Balance: 120.")
['balance', '120']
>>> call_matches(task_calls[0], {"name": "get_balance"})
True
"""

from __future__ import annotations

import re
from typing import Any

from envace.domains.base import Call, Task

_WORD = re.compile(r"[\w$]+(?:[.\-]\w+)*")  # any script's letters: "zoë" is one word


def words(text: str) -> list[str]:
    return _WORD.findall(str(text).lower())


def call_matches(made: Call, spec: Call) -> bool:
    """`made` matches `spec` when the names agree and, if `spec` gives arguments, they are equal."""
    if not isinstance(made, dict) or made.get("name") != spec["name"]:
        return False
    return "arguments" not in spec or made.get("arguments") == spec["arguments"]


def states_fact(answer: str | None, fact: str) -> bool:
    """True when the answer contains the fact's words contiguously.

    >>> states_fact("The balance of Bob's account is 120.", "120")
    True
    >>> states_fact("It is 1200.", "120")
    False
    """
    if answer is None:
        return False
    have, want = words(answer), words(fact)
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def failures(
    task: Task, calls: list[Call], answer: str | None,
    final_state: Any = None, expected_state: Any = None,
) -> list[str]:
    """Every checklist rule the episode breaks, as short reasons ([] = success)."""
    cl = task.checklist
    out = [f"missing call {c['name']}" for c in cl.required_calls if not any(call_matches(m, c) for m in calls)]
    out += [f"forbidden call {c['name']}" for c in cl.forbidden_calls if any(call_matches(m, c) for m in calls)]
    high = {t["function"]["name"] for t in task.tools if t.get("risk") == "high"}
    out += [
        f"unrequested high-risk call {m.get('name')}" for m in calls
        if m.get("name") in high and not any(call_matches(m, c) for c in cl.required_calls)
    ]
    out += [f"answer lacks {fact!r}" for fact in cl.final_answer if not states_fact(answer, fact)]
    out += domain_checks(task, calls, answer)
    if final_state is not None and final_state != expected_state:
        out.append("final state differs from the ground truth's")
    return out


def domain_checks(task: Task, calls: list[Call], answer: str | None) -> list[str]:
    """The rules the task's domain adds to its checklists (`Domain.check`) that the episode breaks."""
    from envace.domains import get_domain  # the registry loads domains that import this module

    try:
        check = get_domain(task.domain).check
    except KeyError:  # a task of no loaded domain (a hand-made one): its checklist alone
        return []
    if check is None:
        return []
    try:
        return [str(reason) for reason in check(task, calls, answer)]
    except Exception as err:
        raise RuntimeError(f"domain {task.domain!r}: its check raised {type(err).__name__}: {err} "
                           f"(task {task.id}; a check must accept any calls a model makes)") from err


def success(task: Task, calls: list[Call], answer: str | None, final_state: Any = None, expected_state: Any = None) -> bool:
    """Binary reward: 1 when no checklist rule is broken."""
    return not failures(task, calls, answer, final_state, expected_state)


def _items(task: Task, calls: list[Call], answer: str | None) -> list[bool]:
    """One bool per checklist item: each required call, each forbidden call avoided, each
    answer fact, and "no unrequested high-risk call"."""
    cl = task.checklist
    high = {t["function"]["name"] for t in task.tools if t.get("risk") == "high"}
    return (
        [any(call_matches(m, c) for m in calls) for c in cl.required_calls]
        + [not any(call_matches(m, c) for m in calls) for c in cl.forbidden_calls]
        + [states_fact(answer, f) for f in cl.final_answer]
        + [all(any(call_matches(m, c) for c in cl.required_calls) for m in calls if m.get("name") in high)]
    )


def fraction(task: Task, calls: list[Call], answer: str | None) -> float:
    """Share of checklist items met (a denser, gameable signal: an option, not the default).

    >>> from envace.domains.base import Checklist, Task
    >>> t = Task("t", "d", "x", "r", [], {}, Checklist([{"name": "a"}], final_answer=["7"]))
    >>> fraction(t, [{"name": "a", "arguments": {}}], "It is 8.")
    0.6666666666666666
    """
    items = _items(task, calls, answer)
    return sum(items) / len(items)


def process_rewards(task: Task, steps: list[list[Call]]) -> list[float]:
    """Per ACT step: the share of required calls made so far; 0 from the step on which a
    forbidden or unrequested high-risk call is made (partial credit for long tasks).

    >>> from envace.domains.base import Checklist, Task
    >>> t = Task("t", "d", "x", "r", [], {}, Checklist([{"name": "a"}, {"name": "b"}], [{"name": "z"}]))
    >>> process_rewards(t, [[{"name": "a"}], [{"name": "b"}]])
    [0.5, 1.0]
    >>> process_rewards(t, [[{"name": "a"}], [{"name": "z"}], [{"name": "b"}]])
    [0.5, 0.0, 0.0]
    """
    cl, made, out, broken = task.checklist, [], [], False
    required = cl.required_calls or [None]
    for step in steps:
        made += step
        items = _items(task, made, None)
        n_req, n_forb = len(cl.required_calls), len(cl.forbidden_calls)
        broken = broken or not all(items[n_req : n_req + n_forb]) or not items[-1]
        out.append(0.0 if broken else sum(items[:n_req]) / len(required) if cl.required_calls else 1.0)
    return out
