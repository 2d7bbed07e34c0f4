"""A declarative domain: a folder, no Python needed.

    tools.json      OpenAI function schemas, each with optional "risk" ("low" | "high"),
                    "read_only" (true for lookups), "preconditions" (prose, or checks the
                    guard can evaluate: see `Precondition`; a high-risk tool needs them) and
                    "interchangeable" (the parameters whose values are opaque names: ids,
                    owners, numbers; warmup renames them consistently so a small model learns
                    to copy them rather than memorise the frequent ones)
    episodes.jsonl  your production agent's logs (format: envace/schemas/logged_episode.schema.json)
    policy.md       optional: the instructions your production agent follows, shown to ACT
    checks.py       optional: `check(task, calls, answer) -> list[str]`, rules success needs
                    beyond the checklist (the reasons an episode breaks them; [] = none)
    backend.json    optional: the real backend, {"kind": "mcp", "command": [...], "reset": tool,
                    "state": tool} or {"kind": "python", "class": "module:Class"}; without it the
                    domain is logs only (no real evaluation)

The domain is named after its folder. Every error names the file and line.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from envace.domains import DomainError  # loaded on demand by envace.domains: no cycle
from envace.domains.base import Backend, Domain, Precondition, Tool

TOOL_KEYS = {"type", "function", "risk", "read_only", "preconditions", "interchangeable"}


def load_folder(folder: Path) -> Domain:
    folder = Path(folder)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", folder.resolve().name):
        raise DomainError(f"{folder}: a domain folder's name is the domain's name: letters, digits, - and _ only")
    tools_file = folder / "tools.json"
    if not tools_file.exists():
        raise DomainError(f"{tools_file}: missing (a domain folder declares its tools there)")
    tools = read_tools(tools_file)
    policy = (folder / "policy.md").read_text(encoding="utf-8").strip() if (folder / "policy.md").exists() else ""
    kind, backend = read_backend(folder, tools)
    return Domain(folder.resolve().name, backend, declared_tools=tools, logs=folder / "episodes.jsonl",
                  policy=policy, backend_kind=kind, check=read_check(folder))


def read_check(folder: Path):
    """The `check` function of the folder's checks.py (None without one)."""
    path = folder / "checks.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"envace_checks_{folder.resolve().name}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's code: any error is reported with its file
        raise DomainError(f"{path}: cannot load: {type(err).__name__}: {err}") from None
    check = getattr(module, "check", None)
    if not callable(check):
        raise DomainError(f"{path}: defines no function check(task, calls, answer) -> list of failure reasons")
    return check


def entries_with_lines(path: Path) -> list[tuple[int, Any]]:
    """The elements of a top-level JSON array with the line each starts on."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DomainError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    decoder, out = json.JSONDecoder(), []
    try:
        if not isinstance(json.loads(text), list):
            raise DomainError(f"{path}:1: expected a JSON array of tool schemas")
    except json.JSONDecodeError as err:
        raise DomainError(f"{path}:{err.lineno}: not valid JSON: {err.msg}") from None
    i = text.index("[") + 1
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        if text[i] == "]":
            return out
        value, end = decoder.raw_decode(text, i)
        out.append((text.count("\n", 0, i) + 1, value))
        i = end


def read_tools(path: Path) -> tuple[Tool, ...]:
    tools: list[Tool] = []
    for line, entry in entries_with_lines(path):
        where = f"{path}:{line}"
        try:
            tool = _tool(entry)
        except (ValueError, TypeError, KeyError) as err:
            raise DomainError(f"{where}: {err}") from None
        if any(t.name == tool.name for t in tools):
            raise DomainError(f"{where}: tool {tool.name!r} is declared twice")
        tools.append(tool)
    if not tools:
        raise DomainError(f"{path}: declares no tools")
    names = {t.name for t in tools}
    for tool in tools:
        for p in tool.preconditions:
            if p.evidence and p.evidence.get("tool") not in names:
                raise DomainError(f"{path}: tool {tool.name!r}: a precondition's evidence names an unknown tool "
                                  f"{p.evidence.get('tool')!r}")
    return tuple(tools)


def _tool(entry: Any) -> Tool:
    if not isinstance(entry, dict) or not isinstance(entry.get("function"), dict):
        raise ValueError('a tool is {"type": "function", "function": {"name", "description", "parameters"}, ...}')
    extra = set(entry) - TOOL_KEYS
    if extra:
        raise ValueError(f"unknown key(s) {', '.join(sorted(extra))} (allowed: {', '.join(sorted(TOOL_KEYS))})")
    fn = entry["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"function.name: {name!r} is not a valid tool name")
    parameters = fn.get("parameters", {"type": "object", "properties": {}})
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as err:
        raise ValueError(f"tool {name!r}: function.parameters is not a valid JSON Schema: {err.message}") from None
    if parameters.get("type") != "object":
        raise ValueError(f"tool {name!r}: function.parameters must be an object schema (type: object)")
    risk = entry.get("risk", "low")
    if risk not in ("low", "high"):
        raise ValueError(f"tool {name!r}: risk must be 'low' or 'high', not {risk!r}")
    if not isinstance(entry.get("read_only", False), bool):
        raise ValueError(f"tool {name!r}: read_only must be true or false")
    preconditions = []
    for p in entry.get("preconditions", []):
        if isinstance(p, dict):
            try:
                p = Precondition(**p)
            except TypeError as err:
                raise ValueError(f"tool {name!r}: precondition {p.get('text')!r}: {err}") from None
        elif not isinstance(p, str):
            raise ValueError(f"tool {name!r}: a precondition is a string or an object with a 'text'")
        preconditions.append(p)
    interchangeable = entry.get("interchangeable", [])
    if not (isinstance(interchangeable, list) and all(isinstance(a, str) for a in interchangeable)):
        raise ValueError(f"tool {name!r}: interchangeable is a list of its parameters' names")
    return Tool(name, str(fn.get("description", "")), parameters, risk, tuple(preconditions),
                read_only=entry.get("read_only", False), interchangeable=tuple(interchangeable))


def read_backend(folder: Path, tools: tuple[Tool, ...]):
    """(kind, factory) of the folder's backend.json; ("none", None) without one."""
    path = folder / "backend.json"
    if not path.exists():
        return "none", None
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DomainError(f"{path}: not valid JSON: {err}") from None
    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind == "mcp":
        from envace.domains.mcp import McpEpisodes

        command, reset = spec.get("command"), spec.get("reset")
        if not (isinstance(command, list) and command and all(isinstance(c, str) for c in command)):
            raise DomainError(f"{path}: command: the server's command line as a list of strings")
        if not isinstance(reset, str):
            raise DomainError(f"{path}: reset: the name of the server's tool that sets an episode's initial "
                              "state (a fresh state per episode needs it)")
        return "mcp", McpEpisodes(folder.resolve(), command, reset, spec.get("state"), tools)
    if kind == "python":
        target = spec.get("class", "")
        module_name, _, attr = target.partition(":")
        if str(folder.resolve()) not in sys.path:
            sys.path.insert(0, str(folder.resolve()))
        try:
            cls = getattr(import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as err:
            raise DomainError(f"{path}: class: cannot load {target!r}: {err}") from None
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise DomainError(f"{path}: class: {target!r} is not a subclass of envace.domains.base.Backend")
        return "python", type(cls.__name__, (cls,), {"tools": tools})
    raise DomainError(f"{path}: kind must be 'mcp' or 'python', not {kind!r}")
