"""Import a production agent's logs: validate every line, then turn each into an episode.

The format is published as a JSON Schema, `envace/schemas/logged_episode.schema.json`
(`envace schema` prints it). Beyond the schema a line must make sense for its domain: the
request comes first, every call names a tool of tools.json with arguments its schema
accepts, each tool message answers a call of the assistant message before it (one per
call, in order), and the episode ends with the answer. The first bad line is reported as
`file:line: field: reason` and nothing is imported.

A task without a checklist gets one derived from its successful episode: its write calls
(tools not marked read_only) with their arguments are required — or, when it wrote nothing,
its lookups — and the answer must state the response values it quotes. A failed episode
without a checklist cannot be judged and is left out (the collect report counts them).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

from jsonschema import Draft202012Validator

from envace.data.episodes import json_values
from envace.domains.base import Checklist, Domain, Task, argument_error
from envace.judge import states_fact, words


class LogError(ValueError):
    """A logged episode is invalid; the message names file:line and the field."""


@cache
def log_schema() -> dict:
    return json.loads(resources.files("envace").joinpath("schemas/logged_episode.schema.json").read_text())


def import_logs(domain: Domain, path: Path | None = None) -> tuple[list[dict], dict]:
    """(episodes in envace's format, a report of how their checklists were obtained)."""
    path = Path(path or domain.logs)
    if not path.exists():
        raise LogError(f"{path}: no such log file (domain {domain.name!r} imports its logged episodes from it)")
    episodes, report = [], {"episodes": 0, "checklist_given": 0, "checklist_derived": 0, "dropped_unjudgeable": 0}
    seen: dict[str, int] = {}
    for line_no, line in lines(path):
        where = f"{path}:{line_no}"
        record = parse_line(line, where)
        check_line(record, domain, where)
        if record["id"] in seen:
            raise LogError(f"{where}: id: {record['id']!r} is already the id of line {seen[record['id']]}")
        seen[record["id"]] = line_no
        episode = to_episode(record, domain)
        report["episodes"] += 1
        if episode is None:
            report["dropped_unjudgeable"] += 1
            continue
        report["checklist_given" if "checklist" in record else "checklist_derived"] += 1
        episodes.append(episode)
    if not episodes:
        raise LogError(f"{path}: no judgeable episode (each needs success: true or a checklist)")
    return episodes, report


def lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise LogError(f"{path}:{n}: not UTF-8 ({err.reason} at byte {err.start} of the line)") from None
            if text.strip():
                yield n, text


def parse_line(line: str, where: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise LogError(f"{where}: not valid JSON: {err.msg} (column {err.colno})") from None
    error = next(iter(sorted(Draft202012Validator(log_schema()).iter_errors(record),
                             key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))), None)
    if error is not None:
        field = ".".join(map(str, error.absolute_path)) or "(line)"
        raise LogError(f"{where}: {field}: {error.message}")
    return record


def check_line(record: dict, domain: Domain, where: str) -> None:
    """What the schema cannot say: the conversation's order and the calls against tools.json."""
    tools = {t.name: t for t in domain.tools}
    messages = record["messages"]
    if messages[0]["role"] != "user":
        raise LogError(f"{where}: messages.0: the first message must be the user's request")
    if messages[-1]["role"] != "assistant" or "answer" not in messages[-1]:
        raise LogError(f"{where}: messages.{len(messages) - 1}: the episode must end with the assistant's answer")
    pending: list[str] = []
    for i, m in enumerate(messages[1:], 1):
        if m["role"] == "tool":
            if not pending:
                raise LogError(f"{where}: messages.{i}: a response for a call that was never made ({m['name']!r})")
            expected = pending.pop(0)
            if m["name"] != expected:
                raise LogError(f"{where}: messages.{i}.name: {m['name']!r} answers the call of {expected!r}")
            continue
        if pending:
            raise LogError(f"{where}: messages.{i}: the call of {pending[0]!r} before it has no response")
        if m["role"] == "user":
            raise LogError(f"{where}: messages.{i}: only the first message is the user's")
        for j, call in enumerate(m.get("calls", [])):
            check_call(call, tools, f"{where}: messages.{i}.calls.{j}")
            pending.append(call["name"])
    for key in ("required_calls", "forbidden_calls"):
        for j, spec in enumerate(record.get("checklist", {}).get(key, [])):
            check_call(spec, tools, f"{where}: checklist.{key}.{j}")


def check_call(call: dict, tools: dict, where: str) -> None:
    if call["name"] not in tools:
        raise LogError(f"{where}.name: unknown tool {call['name']!r} (tools.json has {', '.join(tools)})")
    if "arguments" in call:
        problem = argument_error(tools[call["name"]], call["arguments"])
        if problem:
            raise LogError(f"{where}.arguments: {problem}")


def to_episode(record: dict, domain: Domain) -> dict | None:
    """The episode in envace's format (see `envace.data.episodes`), None when it cannot be judged."""
    messages = [convert(m) for m in record["messages"]]
    turns = [m["calls"] for m in messages if "calls" in m]
    if "checklist" in record:
        given = record["checklist"]
        checklist = Checklist(given["required_calls"], given.get("forbidden_calls", []), given.get("final_answer", []),
                              ground_truth=turns if record["success"] else [])
    elif record["success"]:
        checklist = derive_checklist(messages, domain)
    else:
        return None
    task = Task(record["id"], domain.name, record.get("task_type", "logged"), messages[0]["content"],
                domain.schemas(), record.get("scenario", {}), checklist, policy=domain.policy)
    return {"id": record["id"], "task": task.to_dict(), "agent": "logged", "messages": messages,
            "success": record["success"], "failures": [] if record["success"] else ["logged as failed"]}


def convert(message: dict) -> dict:
    if message["role"] == "tool":
        return {"role": "tool", "name": message["name"], "response": message["response"], "source": "real"}
    if message["role"] == "assistant":
        return {"role": "act", **{k: v for k, v in message.items() if k != "role"}}
    return message


def derive_checklist(messages: list[dict], domain: Domain) -> Checklist:
    read_only = {t.name for t in domain.tools if t.read_only}
    calls = [c for m in messages if "calls" in m for c in m["calls"]]
    writes = [c for c in calls if c["name"] not in read_only]
    required = []
    for c in writes or calls:
        if c not in required:
            required.append(c)
    request, answer = messages[0]["content"], messages[-1]["answer"]
    responses = [m["response"] for m in messages if m["role"] == "tool"]
    quoted = [v for r in responses for v in scalars(r) if words(v) and states_fact(answer, v) and not states_fact(request, v)]
    # a question answered from a yes/no fact: the successful answer's "yes" or "no" is the fact
    said = [w for w in ("yes", "no") if states_fact(answer, w)]
    if not writes and len(said) == 1 and any(isinstance(v, bool) for r in responses for v in json_values(r)):
        quoted.append(said[0])
    return Checklist(required, final_answer=list(dict.fromkeys(quoted)),
                     ground_truth=[m["calls"] for m in messages if "calls" in m])


def scalars(value: Any) -> Iterator[str]:
    """The strings and numbers of a JSON value, as text (booleans say nothing an answer quotes)."""
    return (str(v) for v in json_values(value) if isinstance(v, (str, int, float)) and not isinstance(v, bool))
