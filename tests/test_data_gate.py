"""The data gate catches each class of corruption, naming the expectation and the line."""

import json
import os
import shutil

import pytest

from envace.stages import StageFailed
from envace.stages import validate_data


@pytest.fixture
def project(prepared_dir, tmp_path, monkeypatch):
    """A writable copy of the prepared tiny dataset, as cwd."""
    shutil.copytree(prepared_dir / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _lines(split):
    return open(f"data/prepared/{split}.jsonl").read().splitlines()


def _write(split, lines):
    open(f"data/prepared/{split}.jsonl", "w").write("\n".join(lines) + "\n")


def _edit_line(split, lineno, edit):
    lines = _lines(split)
    ep = json.loads(lines[lineno - 1])
    edit(ep)
    lines[lineno - 1] = json.dumps(ep)
    _write(split, lines)


def _first_call(ep):
    return next(m for m in ep["messages"] if "calls" in m)["calls"][0]


def _gate_failure(params) -> str:
    with pytest.raises(StageFailed) as err:
        validate_data.run(params)
    summary = json.loads(open("metrics/data.json").read())
    assert summary["passed"] is False
    assert "FAILED" in open("reports/data_validation.md").read()
    return str(err.value)


def test_clean_data_passes(project, tiny_params):
    validate_data.run(tiny_params)
    summary = json.loads(open("metrics/data.json").read())
    assert summary["passed"] is True
    assert summary["domains"] == ["bank", "files", "trading"]
    assert set(summary["splits"]) == {"train", "val", "test"} and sum(summary["splits"].values()) == 120
    assert all(r["success"] for r in summary["expectations"])


def test_broken_json_line(project, tiny_params):
    lines = _lines("train")
    lines[6] = lines[6][: len(lines[6]) // 2]
    _write("train", lines)
    msg = _gate_failure(tiny_params)
    assert "every line is valid JSON" in msg and "train.jsonl:7" in msg


def test_unknown_tool(project, tiny_params):
    _edit_line("val", 2, lambda ep: _first_call(ep).update(name="launch_rocket"))
    msg = _gate_failure(tiny_params)
    assert "every call names an offered tool" in msg and "val.jsonl:2" in msg


def test_schema_invalid_argument(project, tiny_params):
    def corrupt(ep):
        args = _first_call(ep)["arguments"]
        args[next(iter(args))] = {"not": "a scalar"}

    _edit_line("train", 3, corrupt)
    msg = _gate_failure(tiny_params)
    assert "every call has schema-valid arguments" in msg and "train.jsonl:3" in msg


def test_test_task_leaked_into_train(project, tiny_params):
    leaked = _lines("test")[0]
    _write("train", _lines("train") + [leaked])
    n = len(_lines("train"))
    msg = _gate_failure(tiny_params)
    assert "task ids are unique" in msg
    assert "no request or scenario is shared across splits" in msg
    assert f"train.jsonl:{n}" in msg


def test_response_that_is_not_json(project, tiny_params):
    def corrupt(ep):
        next(m for m in ep["messages"] if m["role"] == "tool")["response"] = float("nan")  # Python writes NaN

    _edit_line("test", 1, corrupt)
    msg = _gate_failure(tiny_params)
    assert "every response is a JSON value" in msg and "test.jsonl:1" in msg


def test_plain_text_response_passes(project, tiny_params):
    """A tool may answer in plain text (a JSON string): that is a valid response."""
    from envace.stages import validate_data

    _edit_line("test", 1, lambda ep: next(m for m in ep["messages"] if m["role"] == "tool").update(response="Error: boom"))
    validate_data.run(tiny_params)


def test_split_too_small(project, tiny_params):
    params = tiny_params.model_copy(update={"validate_data": tiny_params.validate_data.model_copy(
        update={"min_split_sizes": {"train": 10_000, "val": 1, "test": 1}})})
    msg = _gate_failure(params)
    assert "every split has its minimum size" in msg and "train" in msg


def test_domain_imbalance(project, tiny_params):
    _write("test", [l for l in _lines("test") if '"domain": "bank"' in l])  # a test split of bank alone
    msg = _gate_failure(tiny_params)
    assert "every split holds each domain in its overall share" in msg and "test/bank" in msg


def test_missing_prepared_file_is_a_clear_error(project, tiny_params):
    os.remove("data/prepared/val.jsonl")
    with pytest.raises(StageFailed, match="val.jsonl.*run prepare first"):
        validate_data.run(tiny_params)
