"""Typed, validated configuration: one section of params.yaml per pipeline stage.

`load_params(path)` returns a `Params` object; every section is a frozen pydantic
model that forbids unknown keys, so a typo such as `collect.tasks_per_domian` fails
with an error naming the key instead of silently falling back to a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DOMAIN_NAMES = ("bank", "files", "trading")


class ParamsError(ValueError):
    """params.yaml is missing, malformed, or holds an unknown or mistyped key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DemonstratorConfig(Section):
    """Mistake rates of the scripted demonstrator (all 0 → it solves every task)."""

    skip_check_rate: float = Field(0.7, ge=0, le=1)
    """Probability of skipping a precondition check before an irreversible action."""
    answer_unverified_rate: float = Field(0.7, ge=0, le=1)
    """Probability of answering a yes/no question without looking it up."""
    slip_rate: float = Field(0.1, ge=0, le=1)
    """Probability of one random slip per episode (wrong argument or early answer)."""


class CollectConfig(Section):
    seed: int = 0
    domains: list[Literal["bank", "files", "trading"]] = list(DOMAIN_NAMES)
    tasks_per_domain: int = Field(1400, gt=0)
    demonstrator: DemonstratorConfig = DemonstratorConfig()

    @model_validator(mode="after")
    def _domains_unique(self):
        if len(set(self.domains)) != len(self.domains) or not self.domains:
            raise ValueError("collect.domains must be a non-empty list without repeats")
        return self


class PrepareConfig(Section):
    seed: int = 0
    val_fraction: float = Field(0.1, gt=0, lt=1)
    test_fraction: float = Field(0.15, gt=0, lt=1)
    min_token_frequency: int = Field(1, ge=1)
    """Words seen fewer times in training become spellings from the character alphabet."""

    @model_validator(mode="after")
    def _fractions(self):
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError("prepare.val_fraction + prepare.test_fraction must stay below 0.9")
        return self


class ValidateDataConfig(Section):
    min_split_sizes: dict[Literal["train", "val", "test"], int] = {"train": 2000, "val": 200, "test": 500}
    """Each split must hold at least this many tasks."""
    max_split_share_error: float = Field(0.05, ge=0, le=1)
    """|share of a split - its configured fraction| must stay below this."""
    max_domain_share_error: float = Field(0.1, ge=0, le=1)
    """Within each split, |share of a domain - 1/number of domains| must stay below this."""
    max_examples: int = Field(5, ge=1)
    """How many bad rows a failing expectation shows."""


class Params(Section):
    collect: CollectConfig = CollectConfig()
    prepare: PrepareConfig = PrepareConfig()
    validate_data: ValidateDataConfig = ValidateDataConfig()


def parse_params(raw: dict, source: str = "params.yaml") -> Params:
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping of stage sections, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"])
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            problems.append(f"  {key}: {msg}")
        raise ParamsError(f"{source}: invalid parameters\n" + "\n".join(problems)) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: file not found (run from the project root or pass --params)")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    return parse_params(raw, str(path))
