"""The domain interface: tools, a real backend, a task generator and a demonstrator.

A *domain* bundles
- `tools`: OpenAI function-calling schemas plus a risk level (`low`/`high`); high-risk
  tools declare the preconditions an agent should check before calling them;
- a `Backend` class: the *real environment* of one episode, created from a scenario (the
  hidden initial state). `execute(call)` dispatches by name over the offered tools after
  validating the arguments against the schema, and always returns a JSON response:
  errors are `{"error": {"code": ..., "message": ...}}`, never exceptions;
- `make_task(rng, task_type, index)`: a task generator;
- `demonstrate(task, mistakes, rng)`: a scripted demonstrator. A script is a generator
  that yields a turn (a list of calls), receives the list of responses, and returns the
  final answer. It stands in for the imperfect production agent whose logs a user has.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import asdict, dataclass, field
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


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict
    risk: Literal["low", "high"] = "low"
    preconditions: tuple[str, ...] = ()

    def __post_init__(self):
        if self.risk == "high" and not self.preconditions:
            raise ValueError(f"high-risk tool {self.name!r} must declare its preconditions")

    def schema(self) -> dict:
        """OpenAI function-calling schema, plus our risk level and preconditions."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
            "risk": self.risk,
            "preconditions": list(self.preconditions),
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

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["split"] is None:
            del d["split"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        d = dict(d)
        d["checklist"] = Checklist(**d["checklist"])
        return cls(**d)

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


@dataclass(frozen=True)
class Domain:
    name: str
    backend: type[Backend]
    task_types: tuple[str, ...]
    make_task: Callable[[random.Random, str, str], Task]
    """(rng, task_type, task_id) -> a task without ground truth (see `generate_tasks`)."""
    demonstrate: Callable[[Task, "Mistakes"], Script]
    interchangeable: tuple[tuple[str, ...], ...] = ()
    """Classes of names (ids, file names, owners) that the backend only compares for
    equality: renaming them consistently within an episode leaves it valid."""
    probes: Callable[[dict, random.Random], list[Call]] | None = None
    """(scenario, rng) -> read-only calls to make on a scenario's real backend during warmup:
    practice for REHEARSE on tools the demonstrator seldom calls (see `train.data`)."""

    @property
    def tools(self) -> tuple[Tool, ...]:
        return self.backend.tools

    def schemas(self) -> list[dict]:
        return [t.schema() for t in self.tools]

    def replay(self, task: Task) -> Backend:
        """A fresh backend after replaying the task's ground truth."""
        backend = self.backend(task.scenario)
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
