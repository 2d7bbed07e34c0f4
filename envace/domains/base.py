"""The domain interface: tools, a real backend, and where the episodes come from.

A *domain* bundles
- `tools`: OpenAI function-calling schemas plus a risk level (`low`/`high`); high-risk
  tools declare the preconditions an agent should check before calling them, as prose
  and, where the call's arguments name what decides them, as a machine check
  (`Precondition`) the guard evaluates on the real history;
- a `Backend` (or none: logs only): the *real environment* of one episode, created from a
  scenario (the hidden initial state) — a Python class, or an MCP server (`domains.mcp`).
  `execute(call)` dispatches by name over the offered tools after validating the arguments
  against the schema, and always returns a JSON response: errors are
  `{"error": {"code": ..., "message": ...}}`, never exceptions;
- either logged episodes to import (`logs`), or a task generator `make_task(rng, task_type,
  index)` and a scripted demonstrator `demonstrate(task, mistakes)`: a generator that yields a
  turn (a list of calls), receives the list of responses, and returns the final answer. It
  stands in for the imperfect production agent whose logs a user has."""

from __future__ import annotations

import copy
import functools
import json
import random
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar, Generator, Literal

from jsonschema import Draft202012Validator, validators

# JSON Schema counts 10.0 as an integer; tool backends do not, so neither do we.
_STRICT_TYPES = Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool)
)
StrictValidator = validators.extend(Draft202012Validator, type_checker=_STRICT_TYPES)

Call = dict[str, Any]  # {"name": str, "arguments": dict}
Response = dict[str, Any]  # any JSON object; errors carry an "error" object
Script = Generator[list[Call], list[Response], str]


OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "empty": lambda a, _: len(a) == 0,
    "seen": None,  # `value` is a `field` of some earlier real response (ids come from lookups)
}


@dataclass(frozen=True)
class Precondition:
    """A precondition of a high-risk call: its prose and, when the call's arguments name what
    decides it, a check on what the episode has already seen.

    `evidence` is the lookup that reveals the deciding fact: a tool and its arguments, each
    either a constant or `$name`, an argument of the checked call (`{"tool": "get_balance",
    "arguments": {"account_id": "$from_account"}}`); without it the check reads the call's
    own arguments. `field` is the value checked: a key of the evidence's (latest, non-error)
    response, or of the call's arguments. `op` compares it with `value` (a constant, `$name`,
    or a list of those multiplied: `["$price", "$amount"]`); `seen` asks instead whether any
    earlier real response had `value` under the key `field` (an id no lookup returned names
    nothing that exists). `when` limits the precondition to calls with these argument
    values. All of it is JSON, so a tool file can declare it.
    """

    text: str
    field: str | None = None
    op: str | None = None
    value: Any = None
    evidence: dict | None = None
    when: dict | None = None

    def __post_init__(self):
        if self.op is not None and self.op not in OPS:
            raise ValueError(f"precondition {self.text!r}: unknown op {self.op!r} (expected one of {', '.join(OPS)})")
        if self.op is not None and self.field is None:
            raise ValueError(f"precondition {self.text!r}: a check needs the field it reads")

    @property
    def checkable(self) -> bool:
        return self.op is not None

    def evidence_call(self, args: dict) -> Call | None:
        """The lookup that decides this precondition for a call with `args` (None: its own arguments)."""
        if self.evidence is None:
            return None
        return {"name": self.evidence["tool"], "arguments": {k: _resolve(v, args) for k, v in self.evidence["arguments"].items()}}

    def check(self, call: Call, seen: list[tuple[Call, Any]]) -> bool | None:
        """True / False when `seen` (the real (call, response) pairs so far) decides it, None
        when it does not (no check, not applicable, or the deciding lookup not made yet)."""
        args = call.get("arguments") or {}
        if not self.checkable or any(args.get(k) != v for k, v in (self.when or {}).items()):
            return None
        if self.op == "seen":
            wanted = _resolve(self.value, args)
            return any(_has(r, self.field, wanted) for _, r in seen if not is_error(r))
        source = args
        lookup = self.evidence_call(args)
        if lookup is not None:
            found = [r for c, r in seen if c.get("name") == lookup["name"] and c.get("arguments") == lookup["arguments"]
                     and isinstance(r, dict) and not is_error(r)]
            if not found:
                return None
            source = found[-1]
        if self.field not in source:
            return None
        try:
            return bool(OPS[self.op](source[self.field], _resolve(self.value, args)))
        except TypeError:  # e.g. a string compared with a number: the lookup cannot decide it
            return None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _has(obj: Any, key: str, value: Any) -> bool:
    """Whether `obj` (JSON) holds `value` under `key` at any depth."""
    if isinstance(obj, dict):
        return obj.get(key) == value or any(_has(v, key, value) for v in obj.values())
    return isinstance(obj, list) and any(_has(v, key, value) for v in obj)


def _resolve(value: Any, args: dict) -> Any:
    if isinstance(value, str) and value.startswith("$"):
        return args.get(value[1:])
    if isinstance(value, list):
        product = 1
        for v in value:
            product *= _resolve(v, args)
        return product
    return value


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict
    risk: Literal["low", "high"] = "low"
    preconditions: tuple[str | Precondition, ...] = ()
    read_only: bool = False
    """A lookup that changes nothing (a logged episode's checklist is derived from the other calls)."""
    interchangeable: tuple[str, ...] = ()
    """Arguments whose values are opaque names (ids, owners, numbers) the backend only compares for
    equality: warmup renames their words consistently within an episode (see `train.data.relabel`)."""

    def __post_init__(self):
        if self.risk == "high" and not self.preconditions:
            raise ValueError(f"high-risk tool {self.name!r} must declare its preconditions")
        object.__setattr__(self, "preconditions", tuple(
            p if isinstance(p, Precondition) else Precondition(p) for p in self.preconditions))
        unknown = set(self.interchangeable) - set(self.parameters.get("properties", {}))
        if unknown:
            raise ValueError(f"tool {self.name!r}: interchangeable names no parameter of it: {', '.join(sorted(unknown))}")

    def schema(self) -> dict:
        """OpenAI function-calling schema, plus our risk level and the preconditions' prose."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
            "risk": self.risk,
            "preconditions": [p.text for p in self.preconditions],
        }


def params(required: dict[str, dict] | None = None, **optional: dict) -> dict:
    """JSON schema of an argument object: `params({"owner": STR})`."""
    required = required or {}
    return {
        "type": "object",
        "properties": {**required, **optional},
        "required": list(required),
        "additionalProperties": False,
    }


STR = {"type": "string"}
INT = {"type": "integer"}
NUM = {"type": "number"}


class ToolError(Exception):
    """Raised inside a tool implementation; `execute` turns it into an error response."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def error_response(code: str, message: str) -> Response:
    return {"error": {"code": code, "message": message}}


def is_error(response: Response) -> bool:
    return isinstance(response, dict) and "error" in response


class Backend:
    """The real environment of one episode. Subclasses implement `tool_<name>` methods."""

    tools: ClassVar[tuple[Tool, ...]] = ()

    def __init__(self, scenario: dict):
        self.scenario = copy.deepcopy(scenario)

    def execute(self, call: Call, offered: list[str] | None = None) -> Response:
        """Run one call for real. Never raises: bad calls come back as error responses."""
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return error_response("invalid_call", "a call needs a string 'name'")
        name, args = call["name"], call.get("arguments", {})
        offered_names = offered if offered is not None else [t.name for t in self.tools]
        tool = next((t for t in self.tools if t.name == name), None)
        if tool is None or name not in offered_names:
            return error_response("unknown_tool", f"no tool named {name}")
        problem = argument_error(tool, args)
        if problem:
            return error_response("invalid_arguments", problem)
        try:
            return self.dispatch(name, args)
        except ToolError as err:
            return error_response(err.code, err.message)

    def dispatch(self, name: str, args: dict) -> Response:
        return getattr(self, f"tool_{name}")(**args)

    def state(self) -> dict:
        """The backend's current state (compared against the ground truth's)."""
        raise NotImplementedError

    def facts(self, call: Call) -> dict:
        """The scenario facts this call touches (privileged input for REHEARSE)."""
        raise NotImplementedError


_VALIDATORS: dict[str, Draft202012Validator] = {}


def argument_error(tool: Tool, args: Any) -> str | None:
    """None when `args` satisfies the tool's JSON schema, else a short reason."""
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    key = json.dumps(tool.parameters, sort_keys=True)
    validator = _VALIDATORS.get(key) or _VALIDATORS.setdefault(key, StrictValidator(tool.parameters))
    err = next(iter(sorted(validator.iter_errors(args), key=lambda e: e.path)), None)
    if err is None:
        return None
    where = ".".join(str(p) for p in err.absolute_path)
    return f"{where}: {err.message}" if where else err.message


@dataclass
class Checklist:
    """Ground truth of a task: what a successful episode does and says."""

    required_calls: list[Call]
    """Calls (with these arguments) that must appear in the episode, in any order."""
    forbidden_calls: list[Call] = field(default_factory=list)
    """Calls that must not appear; a spec without "arguments" forbids the tool outright."""
    final_answer: list[str] = field(default_factory=list)
    """Facts the final answer must state (whole words, case-insensitive)."""
    ground_truth: list[list[Call]] = field(default_factory=list)
    """One correct episode's turns; replayed in a fresh backend gives the expected state."""


@dataclass
class Task:
    id: str
    domain: str
    task_type: str
    request: str
    tools: list[dict]
    scenario: dict
    checklist: Checklist
    slots: dict = field(default_factory=dict)
    """The values the request was written from (what the user said, as data)."""
    split: str | None = None
    policy: str = ""
    """Instructions the production agent follows (a plug-in domain's policy.md), shown to ACT."""

    def to_dict(self) -> dict:
        """The task as JSON data. Shallow: it shares the task's tools, scenario and slots (for
        writing out, not for changing), where `asdict` copied them deeply: half of `collect`'s time."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["checklist"] = asdict(self.checklist)
        if d["split"] is None:
            del d["split"]
        if not d["policy"]:
            del d["policy"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        d = dict(d)
        d["checklist"] = Checklist(**d["checklist"])
        return cls(**d)

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


class NoBackend(RuntimeError):
    """A domain without a real backend (logs only) was asked to run a call for real."""


class _NoFacts:
    """The fact source of a domain without a real backend: REHEARSE learns from history alone."""

    def facts(self, call: Call) -> None:
        return None


class ScenarioFacts:
    """Privileged facts read from a logged scenario (the state a backend's reset gets) when the
    backend has no `facts()` of its own: the innermost objects of the scenario a call touches —
    those holding one of its string arguments as a value or as the leading segment of a path-like
    value (an owner of `owner/name`), or a number argument under its own key (`get_branch(repo,
    branch)` touches the branch's object; `list_pull_requests(repo)` the repo's; `list_repos(owner)`
    every repo named `owner/...`). Of a touched object whose collection the tool's name names,
    only that collection (`list_pull_requests(repo)`: the repo's `pull_requests`); else, less the
    collections the tool's description never mentions (`get_repo`, "its default branch and branch
    names": the repo without its pull requests and issues). The elements of a collection the tool
    reads (and the touched objects themselves, when they sit in the collection the tool's name
    names: `list_repos`) are narrowed to what the description says of them: only the elements
    whose one-word value it says ("the open pull requests": those whose `state` is `open`) and,
    of each, only the fields it mentions ("(number and title)"), when it mentions any.

    >>> s = {"repos": [{"name": "a/b", "branches": [{"name": "dev", "merged": False}]}]}
    >>> ScenarioFacts(s).facts({"name": "get_branch", "arguments": {"repo": "a/b", "branch": "dev"}})
    {'touched': [{'name': 'dev', 'merged': False}]}
    >>> [r["name"] for r in ScenarioFacts(s).facts({"name": "list_repos", "arguments": {"owner": "a"}})["touched"]]
    ['a/b']
    >>> ScenarioFacts(s).facts({"name": "list_branches", "arguments": {"repo": "a/b"}})
    {'touched': [{'branches': [{'name': 'dev', 'merged': False}]}]}
    >>> ScenarioFacts(s, {"list_repos": "List an owner's repos by name."}).facts(
    ...     {"name": "list_repos", "arguments": {"owner": "a"}})
    {'touched': [{'name': 'a/b'}]}
    >>> s = {"repos": [{"name": "a/b", "pulls": [{"n": 1, "state": "open"}, {"n": 2, "state": "closed"}]}]}
    >>> ScenarioFacts(s, {"list_pulls": "List the open pulls (their n)."}).facts(
    ...     {"name": "list_pulls", "arguments": {"repo": "a/b"}})
    {'touched': [{'pulls': [{'n': 1}]}]}
    """

    def __init__(self, scenario: Any, descriptions: dict[str, str] | None = None,
                 words: dict[str, set[str]] | None = None):
        self.scenario = scenario
        self.descriptions = descriptions or {}
        """Each tool's description, by name: a touched object's collections it never mentions are left out."""
        self.values = _word_values(scenario, {k: set(v) for k, v in (words or {}).items()})
        """Each key's one-word string values, in this scenario and `words` (the domain's other
        scenarios): what a description may say of an element."""

    def facts(self, call: Call) -> dict:
        args = call.get("arguments") or {}
        tool, description = call["name"], self.descriptions.get(call["name"], "")
        said = _said(tool, description)
        touched = _innermost(self.scenario, args)
        parts = [_named_part(obj, tool, said if description else None, self.values) for _, obj in touched]
        if description and touched and all(_names(tool, key) for key, _ in touched):
            parts = _said_elements(parts, said, self.values)
        return {"touched": parts}


def _said(tool: str, description: str) -> set[str]:
    return set(tool.split("_")) | set(re.findall(r"[a-z]+", description.lower()))


def _names(tool: str, key: str | None) -> bool:
    """The tool's name names the collection `key` (`list_pull_requests`: `pull_requests`)."""
    return key is not None and set(key.split("_")) <= set(tool.split("_"))


def _named_part(obj: dict, tool: str, said: set[str] | None, values: dict[str, set[str]]) -> dict:
    """Of a touched object, only the collection the tool's name names, when it names one
    (`list_pull_requests` reads a repo's `pull_requests`, not its branches and issues); else,
    when the tool has a description (its words `said`), the object less the collections neither
    its name nor its description mentions. Less for REHEARSE to read past: a name to copy out
    of a repo's branches was 130 tokens away from its key in the whole repo, and the response's
    elements sit together in the facts. With a description, the kept collections' elements are
    narrowed to what it says of them (`_said_elements`)."""
    collections = [k for k, v in obj.items() if isinstance(v, (list, dict))]
    named = [k for k in collections if _names(tool, k)]
    if said is None:
        return {named[0]: obj[named[0]]} if len(named) == 1 else obj
    part = {named[0]: obj[named[0]]} if len(named) == 1 else \
        {k: v for k, v in obj.items() if k not in collections or _mentioned_key(k, said)}
    return {k: _said_elements(v, said, values) if isinstance(v, list) else v for k, v in part.items()}


def _said_elements(items: list, said: set[str], values: dict[str, set[str]]) -> list:
    """A collection's elements, narrowed to what a description says of them: where it says one
    of the words a key takes in the scenario ("open", a `state`), only the elements with a word
    it says; then, of each element, only the fields it mentions, when it mentions any. Elements
    that are not objects are left as they are."""
    if not items or not all(isinstance(x, dict) for x in items):
        return items
    for key in sorted({k for x in items for k in x}):
        words = values.get(key, set())
        if words & said and words - said and not _mentioned_key(key, said):
            items = [x for x in items if x.get(key) in said]
    fields = {k for x in items for k in x if _mentioned_key(k, said)}
    return [{k: v for k, v in x.items() if k in fields} for x in items] if fields else items


def _mentioned_key(key: str, said: set[str]) -> bool:
    return all(_mentioned(w, said) for w in key.split("_"))


def _word_values(obj: Any, found: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """key -> the one-word lower-case string values it takes anywhere in `obj`."""
    found = {} if found is None else found
    children = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, child in children:
        if isinstance(key, str) and isinstance(child, str) and re.fullmatch(r"[a-z]+", child):
            found.setdefault(key, set()).add(child)
        _word_values(child, found)
    return found


def _mentioned(word: str, said: set[str]) -> bool:
    """`word` is said, or shares a stem of 4 letters or more with a word said (`branch`, `branches`)."""
    return any(w == word or (min(len(w), len(word)) >= 4 and (w.startswith(word) or word.startswith(w))) for w in said)


def _touches(obj: dict, args: dict) -> bool:
    return any((isinstance(v, str) and _holds(obj, v))
               or (isinstance(v, (int, float)) and not isinstance(v, bool) and obj.get(k) == v) for k, v in args.items())


def _holds(obj: dict, name: str) -> bool:
    """`name` is one of obj's values, or leads a path-like one (`owner` of `owner/name`)."""
    return bool(name) and any(x == name or (isinstance(x, str) and x.startswith(f"{name}/")) for x in obj.values())


def _innermost(obj: Any, args: dict, key: str | None = None) -> list[tuple[str | None, dict]]:
    """(the key it sits under, the object) for each object in `obj` that `args` touch and that
    holds no touched object itself."""
    children = obj.items() if isinstance(obj, dict) else ((key, x) for x in obj) if isinstance(obj, list) else ()
    inner = [found for k, child in children for found in _innermost(child, args, k)]
    if inner:
        return inner
    return [(key, obj)] if isinstance(obj, dict) and _touches(obj, args) else []


@dataclass(frozen=True)
class Domain:
    name: str
    backend: Callable[[Any], Backend] | None
    """The real environment: a `Backend` class (or any factory) called with a scenario, once per
    episode; None for a logs-only domain (no real evaluation is possible)."""
    task_types: tuple[str, ...] = ()
    make_task: Callable[[random.Random, str, str], Task] | None = None
    """(rng, task_type, task_id) -> a task without ground truth (see `generate_tasks`)."""
    demonstrate: Callable[[Task, "Mistakes"], Script] | None = None
    """A scripted demonstrator; a domain without one brings `logs` instead."""
    interchangeable: tuple[tuple[str, ...], ...] = ()
    """Classes of names (ids, file names, owners) that the backend only compares for
    equality: renaming them consistently within an episode leaves it valid."""
    declared_tools: tuple[Tool, ...] = ()
    """The tools when the backend does not define them (a declarative folder's tools.json)."""
    logs: Any = None
    """The logged episodes `collect` imports (a path), instead of generating with `demonstrate`."""
    policy: str = ""
    """Instructions the production agent follows, shown to ACT before every request."""
    backend_kind: Literal["python", "mcp", "none"] = "python"
    check: Callable[[Task, list[Call], str | None], list[str]] | None = None
    """Success beyond the checklist: (task, calls, final answer) -> the rules it breaks, as short
    reasons ([] = none). It judges imagined episodes too, where no final state can be compared."""

    @property
    def tools(self) -> tuple[Tool, ...]:
        return self.declared_tools or self.backend.tools

    def schemas(self) -> list[dict]:
        return [t.schema() for t in self.tools]

    @property
    def has_facts(self) -> bool:
        """Whether the backend tells the scenario facts a call touches (privileged input for REHEARSE)."""
        return isinstance(self.backend, type) and issubclass(self.backend, Backend) \
            and self.backend.facts is not Backend.facts

    @property
    def facts_from(self) -> str:
        """Where REHEARSE's privileged facts come from: the backend's `facts()`, the logged scenario
        (a real backend without `facts()`), or nowhere (logs only: history alone)."""
        return "backend" if self.has_facts else "scenario" if self.backend is not None else "none"

    def fact_source(self, scenario: Any):
        """What reads a scenario's facts; it never executes a call (no facts: every call gets None)."""
        if self.has_facts:
            return self.backend(scenario)
        if self.backend is None or not scenario:
            return _NoFacts()
        return ScenarioFacts(scenario, {t.name: t.description for t in self.tools}, self.logged_words)

    @functools.cached_property
    def logged_words(self) -> dict[str, set[str]]:
        """Each key's one-word string values over every logged scenario (`state`: open, merged,
        closed): a description saying "the open pull requests" filters by `state` even in a
        scenario where none is open. Empty without logs; a line that does not parse is left to
        `collect`, which names it."""
        found: dict[str, set[str]] = {}
        if self.logs is None or not Path(self.logs).is_file():
            return found
        with open(self.logs, encoding="utf-8") as lines:
            for line in lines:
                try:
                    episode = json.loads(line)
                except ValueError:
                    continue
                if isinstance(episode, dict):
                    _word_values(episode.get("scenario"), found)
        return found

    def real(self, scenario: Any) -> Backend:
        """A fresh real backend for one episode."""
        if self.backend is None:
            raise NoBackend(f"domain {self.name!r} has no real backend (logs only): nothing can run for real")
        return self.backend(scenario)

    def replay(self, task: Task) -> Backend:
        """A fresh backend after replaying the task's ground truth."""
        backend = self.real(task.scenario)
        for turn in task.checklist.ground_truth:
            for call in turn:
                backend.execute(call, task.tool_names)
        return backend


@dataclass(frozen=True)
class Mistakes:
    """Per-episode systematic mistakes, drawn once by the demonstrator runner."""

    skip_check: bool = False
    answer_unverified: bool = False


def call(name: str, /, **arguments: Any) -> Call:
    return {"name": name, "arguments": arguments}
