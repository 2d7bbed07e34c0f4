"""Bad input, everywhere: a table of broken params, logs, prepared files, encodings, tool
schemas, model directories and command lines, each run as a user runs it. Every one must end
with one clear line naming the file (and line or key) and the reason, exit != 0, no
traceback, and no partial or stale artifact."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.conftest import ROOT, TINY_PARAMS, write_params

PY = sys.executable


@dataclass
class Case:
    edit: Callable[[Path], None]  # breaks something in a copy of a tiny project
    command: list[str]
    says: str  # the last line of stderr contains this
    untouched: tuple[str, ...] = ()  # artifacts that must be exactly as before (a stage that never started)
    absent: tuple[str, ...] = ()  # artifacts that must not exist afterwards: nothing half-written, and
    # nothing stale (a failed stage's old outputs no longer describe its inputs; DVC removes them too)


def text(path: str, content: str | bytes) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
    return edit


def params_with(section: str, **values) -> Callable[[Path], None]:
    """The project's params with `values` written into `section` (unchecked: they may be bad)."""
    def edit(root: Path) -> None:
        raw = yaml.safe_load((root / "params.yaml").read_text())
        raw[section].update(values)
        (root / "params.yaml").write_text(yaml.safe_dump(raw))
    return edit


def raw_line(n: int, line: str | bytes) -> Callable[[Path], None]:
    """Line `n` (1-based) of the raw episodes replaced."""
    def edit(root: Path) -> None:
        path = root / "data/raw/episodes.jsonl"
        lines = path.read_bytes().splitlines()
        lines[n - 1] = line if isinstance(line, bytes) else line.encode()
        path.write_bytes(b"\n".join(lines) + b"\n")
    return edit


def first_raw_with(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        path = root / "data/raw/episodes.jsonl"
        lines = path.read_text().splitlines()
        episode = json.loads(lines[2])
        change(episode)
        lines[2] = json.dumps(episode)
        path.write_text("\n".join(lines) + "\n")
    return edit


def params_text(replace: str, by: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        path = root / "params.yaml"
        assert replace in path.read_text()
        path.write_text(path.read_text().replace(replace, by, 1))
    return edit


def remove(path: str) -> Callable[[Path], None]:
    return lambda root: (shutil.rmtree if (root / path).is_dir() else Path.unlink)(root / path)


def truncate(path: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        data = (root / path).read_bytes()
        (root / path).write_bytes(data[: len(data) // 2])
    return edit


def both(*edits: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda root: [e(root) for e in edits]


def own_domain(tools: str | bytes) -> Callable[[Path], None]:
    """A folder domain whose tools.json is `tools`."""
    def edit(root: Path) -> None:
        text("domains/mine/tools.json", tools)(root)
        text("domains/mine/episodes.jsonl", "")(root)
        params_with("collect", domains=["domains/mine"])(root)
    return edit


STAGE = [PY, "-m", "envace.stages."]
PREPARE, VALIDATE, WARMUP, COLLECT = (STAGE[:2] + [STAGE[2] + s] for s in ("prepare", "validate_data", "warmup", "collect"))
CHECK = [PY, "-m", "envace.cli", "check-params", "--params", "params.yaml"]
PREPARED = ("data/prepared/train.jsonl", "data/prepared/val.jsonl", "data/prepared/test.jsonl",
            "data/prepared/tokenizer/tokenizer.json", "metrics/prepare.json")

CASES = {
    # params
    "params: empty file": Case(text("params.yaml", ""), CHECK, "params.yaml: empty; expected the stage sections"),
    "params: a missing section": Case(params_text("warmup:", "warmup_typo:"), CHECK, "missing section(s) warmup"),
    "params: a key given twice": Case(params_text("  lr: 0.01\n", "  lr: 0.01\n  lr: 0.02\n"), CHECK,
                                      "key 'lr' is given twice (line"),
    "params: lr is inf": Case(params_text("  lr: 0.01\n", "  lr: .inf\n"), CHECK, "warmup.lr: Input should be a finite number"),
    "params: min_epochs above max_epochs": Case(params_with("warmup", max_epochs=2, min_epochs=3), CHECK,
                                                "min_epochs 3 is more than max_epochs 2"),
    "params: a cron field out of range": Case(params_with("serve", cron="99 99 99 99 99"), CHECK,
                                              "minute 99 is out of range 0-59"),
    "params: an unknown key": Case(params_with("prepare", val_fraktion=0.1), CHECK, "prepare.val_fraktion: unknown key"),
    "params: a mistyped value": Case(params_with("prepare", val_fraction="a tenth"), CHECK, "prepare.val_fraction:"),
    "params: not YAML": Case(text("params.yaml", "collect: [\n"), CHECK, "params.yaml: not valid YAML"),
    "params: not UTF-8": Case(text("params.yaml", b"collect:\n  seed: \xff\n"), CHECK, "params.yaml: not UTF-8 text"),
    "params: to a stage, a missing file": Case(lambda root: None, PREPARE + ["--params", "nope.yaml"],
                                               "nope.yaml: file not found", untouched=PREPARED),
    # raw episodes (prepare's input)
    "raw: a line without task": Case(first_raw_with(lambda e: e.pop("task")), PREPARE,
                                     "data/raw/episodes.jsonl:3: (line): 'task' is a required property", absent=PREPARED),
    "raw: a line that is not an object": Case(raw_line(3, "[1, 2]"), PREPARE,
                                              "data/raw/episodes.jsonl:3: (line): [1, 2] is not of type 'object'",
                                              absent=PREPARED),
    "raw: a line that is not JSON": Case(raw_line(3, '{"id": '), PREPARE, "data/raw/episodes.jsonl:3: not valid JSON",
                                         absent=PREPARED),
    "raw: a byte that is not UTF-8": Case(raw_line(3, b'{"id": "\xe9"}'), PREPARE,
                                          "data/raw/episodes.jsonl:3: not UTF-8 text", absent=PREPARED),
    "raw: a message of an unknown role": Case(first_raw_with(lambda e: e["messages"][0].update(role="system")), PREPARE,
                                              "data/raw/episodes.jsonl:3: messages/0:", absent=PREPARED),
    "raw: a call without arguments": Case(
        first_raw_with(lambda e: next(m for m in e["messages"] if "calls" in m)["calls"][0].pop("arguments")), PREPARE,
        "data/raw/episodes.jsonl:3: messages/", absent=PREPARED),
    "raw: the file is missing": Case(remove("data/raw/episodes.jsonl"), PREPARE,
                                     "data/raw/episodes.jsonl: cannot read", absent=PREPARED),
    # prepared splits (the data gate's input): the verdict says failed, the old "passed" does not stay
    "prepared: a byte that is not UTF-8": Case(
        lambda root: (root / "data/prepared/train.jsonl").write_bytes(
            (root / "data/prepared/train.jsonl").read_bytes().replace(b"\n", b"\n\xff", 1)), VALIDATE,
        "e.g. train.jsonl:2"),
    "prepared: a split is missing": Case(remove("data/prepared/test.jsonl"), VALIDATE,
                                         "missing prepared file(s): data/prepared/test.jsonl",
                                         absent=("metrics/data.json", "reports/data_validation.md")),
    # tool schemas of your own domain
    "tools.json: not JSON": Case(own_domain("[{"), COLLECT, "domains/mine/tools.json:1: not valid JSON",
                                 absent=("data/raw/episodes.jsonl",)),
    "tools.json: not UTF-8": Case(own_domain(b"[\xff]"), COLLECT, "domains/mine/tools.json: not UTF-8 text",
                                  absent=("data/raw/episodes.jsonl",)),
    "tools.json: a parameter schema that is not JSON Schema": Case(
        own_domain('[{"type": "function", "function": {"name": "t", "parameters": {"type": "objekt"}}}]'), COLLECT,
        "domains/mine/tools.json:1: tool 't': function.parameters is not a valid JSON Schema",
        absent=("data/raw/episodes.jsonl",)),
    "collect.domains: an unknown domain": Case(params_with("collect", domains=["bank", "nope"]), COLLECT,
                                               "collect.domains: 'nope': expected a built-in domain"),
    # model directories
    "model: truncated weights": Case(truncate("models/base/model.safetensors"), WARMUP,
                                     "models/base: the weights do not load", absent=("models/warmup",)),
    "model: no tokenizer": Case(remove("models/base/tokenizer.json"), WARMUP,
                                "models/base: the checkpoint has no tokenizer", absent=("models/warmup",)),
    "model: config.json not JSON": Case(text("models/base/config.json", "{"), WARMUP,
                                        "models/base: the tokenizer does not load", absent=("models/warmup",)),
    "model: no model at all": Case(remove("models/base"), WARMUP, "models/base holds no model: run the base_model stage first",
                                   absent=("models/warmup",)),
    # command lines
    "cli: run --until a stage that does not exist": Case(
        lambda root: None, [PY, "-m", "envace.cli", "run", "--project-dir", ".", "--until", "nonsense"],
        "--until 'nonsense' is not a stage"),
    "cli: a train variant that does not exist": Case(lambda root: None, [PY, "-m", "envace.stages.train", "--variant", "sim"],
                                                     "invalid choice: 'sim'"),
}


@pytest.fixture(scope="module")
def project(prepared_dir, tmp_path_factory) -> Path:
    """A tiny project through base_model: params, dvc.yaml, raw and prepared data, the base model."""
    from envace.config import parse_params
    from envace.stages import base_model

    root = tmp_path_factory.mktemp("bad-inputs") / "project"
    shutil.copytree(prepared_dir, root)
    write_params(root / "params.yaml", TINY_PARAMS)
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    (root / "metrics").mkdir(exist_ok=True)
    (root / "metrics/data.json").write_text('{"passed": true}\n')  # a previous run's verdict
    (root / "reports").mkdir(exist_ok=True)
    (root / "reports/data_validation.md").write_text("# Data validation: PASSED\n")
    cwd = Path.cwd()
    try:
        import os

        os.chdir(root)
        base_model.run(parse_params(TINY_PARAMS))
    finally:
        os.chdir(cwd)
    return root


def snapshot(root: Path, paths: tuple[str, ...]) -> dict[str, bytes | None]:
    return {p: (root / p).read_bytes() if (root / p).is_file() else None for p in paths}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_clear_line_and_leaves_no_partial_or_stale_artifact(name, project, tmp_path):
    case = CASES[name]
    root = tmp_path / "project"
    shutil.copytree(project, root, symlinks=True)
    case.edit(root)
    before = snapshot(root, case.untouched)
    out = subprocess.run(case.command, cwd=root, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
    assert out.returncode != 0, f"{name}: exit 0\n{out.stdout[-1500:]}"
    assert "Traceback" not in out.stderr, f"{name}: a traceback\n{out.stderr[-3000:]}"
    assert case.says in last, f"{name}: the last line is {last!r}"
    assert snapshot(root, case.untouched) == before, f"{name}: an artifact changed"
    assert not [p for p in case.absent if (root / p).exists()], f"{name}: a stale or partial artifact is left"
    assert not [p for p in root.rglob(".*") if p.name not in (".dvc", ".dvcignore") and ".dvc" not in p.parts
                and "gx" not in p.parts], f"{name}: a temp file is left"  # gx/: GE's store (its own dot-files)


def test_the_corpus_is_broad():
    kinds = {name.split(":")[0] for name in CASES}
    assert len(CASES) >= 25 and {"params", "raw", "prepared", "tools.json", "model", "cli"} <= kinds


def test_a_prepared_file_that_breaks_the_gate_leaves_a_failed_verdict(project, tmp_path):
    """The gate's own verdict replaces the last run's "passed": it says failed, and where."""
    root = tmp_path / "project"
    shutil.copytree(project, root, symlinks=True)
    CASES["prepared: a byte that is not UTF-8"].edit(root)
    subprocess.run(VALIDATE, cwd=root, capture_output=True, text=True, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    verdict = json.loads((root / "metrics/data.json").read_text())
    assert verdict["passed"] is False and "train.jsonl:2" in json.dumps(verdict)


def test_an_unreadable_checkpoint_is_set_aside_and_training_starts_over(project, tmp_path):
    from envace.train.checkpoint import resumable

    ckpt = tmp_path / "warmup"
    ckpt.mkdir()
    (ckpt / "last.ckpt").write_bytes(b"half a checkpoint")
    (ckpt / "fingerprint").write_text("same")
    assert resumable(ckpt, "same", "warmup") is None
    assert not (ckpt / "last.ckpt").exists() and (ckpt / "fingerprint").read_text() == "same"
