"""End to end with your own tools: the gitforge folder (MCP server, imported logs) through the
Prefect flow over the DVC stages on a tiny profile; and the same logs without a backend."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY_PARAMS, make_project

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gitforge"

TINY_OWN = {
    **TINY_PARAMS,
    "collect": {"domains": ["domains/gitforge"]},
    "validate_data": {**TINY_PARAMS["validate_data"], "min_split_sizes": {"train": 100, "val": 5, "test": 20}},
    "warmup": {**TINY_PARAMS["warmup"], "eval_tasks": 8},
    "evaluate": {"tasks": 16},
    "rehearse": {"tasks": 4, "budgets": [0, 1]},
    "registry": {"model_name": "gitforge-agent"},
}


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


def own_project(path: Path, params: dict, episodes: int = 160) -> Path:
    project = make_project(path, params)
    folder = project / "domains" / "gitforge"
    shutil.copytree(EXAMPLE / "domains" / "gitforge", folder, ignore=shutil.ignore_patterns("episodes.jsonl", "__pycache__"))
    subprocess.run([sys.executable, str(EXAMPLE / "make_logs.py"), "--episodes", str(episodes), "--seed", "5",
                    "--out", str(folder / "episodes.jsonl")], check=True, capture_output=True)
    return project


def test_own_domain_runs_end_to_end_through_the_mcp_server(tmp_path, prefect_api, monkeypatch):
    from flows.full_pipeline import envace_flow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    project = own_project(tmp_path / "own", TINY_OWN)
    summary = envace_flow(project_dir=str(project))
    assert all(s["ran"] for s in summary["stages"].values()) and summary["stages"].keys() >= {"evaluate", "register"}
    collected = json.loads((project / "metrics/collect.json").read_text())["sources"]["gitforge"]
    assert collected["backend"] == "mcp" and collected["privileged_facts"] == "scenario"
    assert collected["checklist_derived"] > 0 and collected["checklist_given"] > 0
    assert "derived from the successful episode" in (project / "reports/data_validation.md").read_text()
    rehearsal = json.loads((project / "metrics/rehearsal.json").read_text())
    assert rehearsal["per_tool"], "the rehearsal gate reports per tool"
    evaluation = json.loads((project / "metrics/eval.json").read_text())
    assert evaluation["backend"] == "mcp" and evaluation["available"] is True
    variants = evaluation["variants"]
    assert {"sft", "envace"} <= set(variants) and variants["envace"]["real_env_calls_train"] == 0
    assert variants["envace"]["n"] == 16 and "unseen_values" in variants["envace"]
    # the guard table replays logged calls through the MCP server up to each high-risk call
    guard = json.loads((project / "metrics/rehearse.json").read_text())["guard"]["envace"]["informed"]
    assert guard["n_harmful"] + guard["n_safe"] > 0 and set(guard["per_tool"]) <= {"delete_branch", "merge_pull_request"}
    assert json.loads((project / "metrics/register.json").read_text())["version"] == "1"


def test_logs_only_domain_trains_and_says_it_cannot_evaluate(tmp_path, prefect_api, monkeypatch):
    from flows.full_pipeline import envace_flow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = {**TINY_OWN, "collect": {"domains": ["domains/gitforge"], "real_backends": False}}
    project = own_project(tmp_path / "logs-only", params)
    summary = envace_flow(project_dir=str(project), until="evaluate")
    assert all(s["ran"] for s in summary["stages"].values())
    assert json.loads((project / "metrics/collect.json").read_text())["sources"]["gitforge"]["privileged_facts"] == "none"
    skipped = json.loads((project / "metrics/train/real_env.json").read_text())
    assert skipped["steps"] == 0 and "no real backend" in skipped["skipped"]
    assert json.loads((project / "metrics/train/envace.json").read_text())["steps"] == TINY_OWN["train"]["steps"]
    evaluation = json.loads((project / "metrics/eval.json").read_text())
    assert evaluation == {"backend": "none", "available": False, "variants": {}, "n_tasks": 0,
                          "reason": "no real backend for domain(s) gitforge (logs only)"}
    assert "not possible" in (project / "reports/eval.md").read_text()
    warmup = json.loads((project / "metrics/warmup.json").read_text())
    assert warmup["real_success"] is None and "logs only" in warmup["real"]["unavailable"]


def test_appending_logs_makes_collect_stale(tmp_path):
    """The log file is a DVC-tracked input of collect: append to it and collect is stale."""
    params = {**TINY_OWN}
    project = own_project(tmp_path / "append", params, episodes=60)
    spec = yaml.safe_load((project / "dvc.yaml").read_text())
    spec["stages"]["collect"]["deps"].append("domains/gitforge")
    (project / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env_path = f"{Path(sys.executable).parent}:{__import__('os').environ['PATH']}"
    run = lambda *a: subprocess.run([sys.executable, "-m", "dvc", *a], cwd=project, capture_output=True, text=True,  # noqa: E731
                                    env={**__import__("os").environ, "PATH": env_path})
    assert run("repro", "collect").returncode == 0
    assert "up to date" in run("status", "collect").stdout
    subprocess.run([sys.executable, str(EXAMPLE / "make_logs.py"), "--episodes", "50", "--seed", "9", "--first-id", "5000",
                    "--append", "--out", str(project / "domains/gitforge/episodes.jsonl")], check=True, capture_output=True)
    status = run("status", "collect").stdout
    assert "collect:" in status and "modified:" in status and "domains/gitforge" in status
