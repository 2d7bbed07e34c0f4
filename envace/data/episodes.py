"""Episodes as stored in JSONL logs — the format users bring their own logs in.

One episode per line:
    {"id": str, "task": Task.to_dict(), "agent": str, "success": bool | null,
     "messages": [
        {"role": "user", "content": str},
        {"role": "act", "calls": [{"name": str, "arguments": {...}}, ...]},
        {"role": "tool", "name": str, "response": {...}, "source": "real"},   # one per call
        ...
        {"role": "act", "calls": [...], "held": [1]},  # the guard held call 1: never executed;
        {"role": "tool", ..., "source": "guard"},      # its tool message holds the hold
        ...
        {"role": "act", "answer": str}]}
Every response is stored exactly as the backend returned it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from envace.domains import get_domain


def recorded_calls(episode: dict) -> list[tuple[dict, dict]]:
    """(call, real response) for every recorded call of an episode, in order."""
    msgs, out = episode["messages"], []
    offered = {t["function"]["name"] for t in episode["task"]["tools"]}
    for j, m in enumerate(msgs):
        if m["role"] == "act" and "calls" in m:
            replies = [r for r in msgs[j + 1 : j + 1 + len(m["calls"])] if r["role"] == "tool"]
            out += [(c, r["response"]) for c, r in zip(m["calls"], replies) if c["name"] in offered]
    return out


def fact_source(task: dict):
    """What reads the task's scenario facts (its domain's backend, or nothing): it never executes."""
    return get_domain(task["domain"]).fact_source(task["scenario"])


def json_values(obj: Any) -> list:
    """The plain values (not dicts or lists) of a JSON value, depth first.

    >>> json_values({"a": [1, {"b": "x"}], "c": None})
    [1, 'x', None]
    """
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in json_values(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in json_values(v)]
    return [obj]


def calls_of(messages: list[dict]) -> list[dict]:
    """Every tool call ACT made and that ran, in order (a call the guard held never ran)."""
    return [c for m in messages if m.get("role") == "act"
            for i, c in enumerate(m.get("calls", [])) if i not in m.get("held", ())]


def answer_of(messages: list[dict]) -> str | None:
    """The final answer, or None when the episode did not end with one."""
    last = messages[-1] if messages else {}
    return last.get("answer") if last.get("role") == "act" else None


_CALL = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1}, "arguments": {"type": "object"}},
    "required": ["name", "arguments"],
}
_MESSAGE = {
    "oneOf": [
        {"type": "object", "properties": {"role": {"const": "user"}, "content": {"type": "string"}},
         "required": ["role", "content"]},
        {"type": "object", "properties": {"role": {"const": "act"}, "calls": {"type": "array", "items": _CALL, "minItems": 1}},
         "required": ["role", "calls"]},
        {"type": "object", "properties": {"role": {"const": "act"}, "answer": {"type": "string"}},
         "required": ["role", "answer"]},
        {"type": "object",
         "properties": {"role": {"const": "tool"}, "name": {"type": "string"}, "response": {},
                        "source": {"enum": ["real", "rehearsed", "simulator", "guard"]}},
         "required": ["role", "name", "response", "source"]},
    ]
}
_TASK = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "domain": {"type": "string"},
        "task_type": {"type": "string"},
        "request": {"type": "string", "minLength": 1},
        "tools": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "properties": {"function": {"type": "object", "required": ["name", "parameters"]},
                           "risk": {"enum": ["low", "high"]}},
            "required": ["function", "risk"]}},
        "scenario": {"type": "object"},
        "checklist": {"type": "object", "required": ["required_calls", "forbidden_calls", "final_answer", "ground_truth"]},
        "slots": {"type": "object"},
        "split": {"enum": ["train", "val", "test"]},
    },
    "required": ["id", "domain", "task_type", "request", "tools", "scenario", "checklist"],
}
EPISODE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "envace episode (one JSONL line)",
    "type": "object",
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "task": _TASK,
        "agent": {"type": "string"},
        "success": {"type": ["boolean", "null"]},
        "messages": {"type": "array", "minItems": 2, "items": _MESSAGE},
    },
    "required": ["id", "task", "messages"],
}


@cache
def _validator():
    from jsonschema import Draft202012Validator

    return Draft202012Validator(EPISODE_SCHEMA)


def episode_error(row: Any) -> str | None:
    """Why a line is not an episode of this format (the first reason, with its JSON path), or None."""
    err = next(iter(_validator().iter_errors(row)), None)
    if err is None:
        return None
    return f"{'/'.join(map(str, err.absolute_path)) or '(line)'}: {err.message[:160]}"
