"""Task generation and the demonstrator run in the real backends.

`generate_tasks` draws tasks with unique requests (so splits can keep requests apart),
cycling through the domain's task types, and records each task's ground truth by running
the mistake-free demonstrator in a fresh backend.
`demonstrate` runs the imperfect demonstrator: per episode it draws the systematic
mistakes (`Mistakes`) and at most one random slip (a wrong argument or an early answer).
"""

from __future__ import annotations

import json
import random

from envace.config import DemonstratorConfig
from envace.data.episodes import calls_of, json_values
from envace.domains.base import Domain, Mistakes, Task, is_error
from envace.judge import failures

NO_MISTAKES = DemonstratorConfig(skip_check_rate=0.0, answer_unverified_rate=0.0, slip_rate=0.0)
SLIPS = ("wrong_argument", "early_answer")


def generate_tasks(domain: Domain, n: int, seed: int) -> list[Task]:
    rng = random.Random(f"{seed}-{domain.name}")
    tasks, seen = [], set()
    for i in range(n):
        task_type = domain.task_types[i % len(domain.task_types)]
        for _ in range(50):
            task = domain.make_task(rng, task_type, f"{domain.name}-{i:05d}")
            if task.request not in seen:
                break
        else:
            raise RuntimeError(f"{domain.name}: no new request for {task_type} after 50 draws; lower tasks_per_domain")
        seen.add(task.request)
        episode = demonstrate(domain, task, NO_MISTAKES, random.Random(0))
        task.checklist.ground_truth = [m["calls"] for m in episode["messages"] if "calls" in m]
        if not episode["success"]:
            raise AssertionError(f"{task.id}: the mistake-free demonstrator fails: {episode['failures']}")
        tasks.append(task)
    return tasks


def demonstrate(domain: Domain, task: Task, rates: DemonstratorConfig, rng: random.Random) -> dict:
    """One demonstrator episode in the real backend, judged against the checklist."""
    mistakes = Mistakes(skip_check=rng.random() < rates.skip_check_rate,
                        answer_unverified=rng.random() < rates.answer_unverified_rate)
    slip, slip_turn = (rng.choice(SLIPS), rng.randrange(3)) if rng.random() < rates.slip_rate else (None, -1)
    backend = domain.backend(task.scenario)
    script = domain.demonstrate(task, mistakes)
    messages: list[dict] = [{"role": "user", "content": task.request}]
    responses: list[dict] = []
    try:
        turn, calls = 0, next(script)
        while True:
            if turn == slip_turn and slip == "early_answer":
                answer = "Done."
                break
            if turn == slip_turn:
                calls = _wrong_argument(calls, task.scenario, rng)
            messages.append({"role": "act", "calls": calls})
            responses = [backend.execute(c, task.tool_names) for c in calls]
            messages += [{"role": "tool", "name": c["name"], "response": r, "source": "real"} for c, r in zip(calls, responses)]
            turn, calls = turn + 1, script.send(responses)
    except StopIteration as stop:
        answer = stop.value
    except KeyError:  # the script met a response it did not expect (an error after a slip)
        code = next((r["error"]["code"] for r in responses if is_error(r)), "unexpected_response")
        answer = f"Failed: {code}."
    messages.append({"role": "act", "answer": answer})
    expected = domain.replay(task).state() if task.checklist.ground_truth else backend.state()
    why = failures(task, calls_of(messages), answer, backend.state(), expected)
    return {"id": task.id, "task": task.to_dict(), "agent": "demonstrator", "messages": messages,
            "success": not why, "failures": why}


def _wrong_argument(calls: list[dict], scenario: dict, rng: random.Random) -> list[dict]:
    """Replace one argument with another value of the same type taken from the scenario."""
    calls = json.loads(json.dumps(calls))
    target = rng.choice(calls)
    if not target["arguments"]:
        return calls
    key = rng.choice(sorted(target["arguments"]))
    value = target["arguments"][key]
    pool = sorted({x for x in json_values(scenario) if type(x) is type(value) and x != value}, key=str)
    if pool:
        target["arguments"][key] = rng.choice(pool)
    return calls
