"""End to end with your own tools: the gitforge folder (MCP server, imported logs) served as the
Prefect deployment over the DVC stages on a tiny profile, retraining on appended logs; and the
same logs without a backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY_PARAMS, make_project
from tests.test_service import Service

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gitforge"

TINY_OWN = {
    **TINY_PARAMS,
    "collect": {"domains": ["domains/gitforge"]},
    # the example's tokenizer options, so their spellings go through every stage that encodes or decodes
    "prepare": {**TINY_PARAMS["prepare"], "split_digits": True, "spaced_words": True, "digit_places": True},
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


def test_a_deployment_runs_own_tools_end_to_end_and_retrains_on_appended_logs(tmp_path):
    """The gitforge folder served as the deployment envace/full-pipeline: the first run imports
    the logs and evaluates through the MCP server; 50 appended logged episodes make `collect`
    stale, and the next deployment run retrains and registers a new version."""
    from mlflow.tracking import MlflowClient
    from transformers import PreTrainedTokenizerFast

    project = own_project(tmp_path / "own", TINY_OWN)
    spec = yaml.safe_load((project / "dvc.yaml").read_text())  # what the flow's re-rooted dvc.yaml adds
    spec["stages"]["collect"]["deps"].append("domains/gitforge")
    (project / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    service = Service(project)
    try:
        service.start()
        done, _ = service.trigger()
        assert done.returncode == 0, done.stdout[-3000:] + service.logs()
        collected = json.loads((project / "metrics/collect.json").read_text())["sources"]["gitforge"]
        assert collected["backend"] == "mcp" and collected["privileged_facts"] == "scenario"
        assert collected["checklist_derived"] > 0 and collected["checklist_given"] > 0
        assert "derived from the successful episode" in (project / "reports/data_validation.md").read_text()
        assert json.loads((project / "metrics/rehearsal.json").read_text())["per_tool"], "the gate reports per tool"
        evaluation = json.loads((project / "metrics/eval.json").read_text())
        assert evaluation["backend"] == "mcp" and evaluation["available"] is True
        variants = evaluation["variants"]
        assert {"sft", "envace"} <= set(variants) and variants["envace"]["real_env_calls_train"] == 0
        assert variants["envace"]["n"] == 16 and "unseen_values" in variants["envace"]
        # the guard table replays logged calls through the MCP server up to each high-risk call
        guard = json.loads((project / "metrics/rehearse.json").read_text())["guard"]["envace"]["informed"]
        assert guard["n_harmful"] + guard["n_safe"] > 0 and set(guard["per_tool"]) <= {"delete_branch", "merge_pull_request"}
        assert json.loads((project / "metrics/register.json").read_text())["version"] == "1"
        tokenizer = PreTrainedTokenizerFast.from_pretrained(project / "data/prepared/tokenizer")
        assert [len(t) for t in tokenizer.tokenize("#221")] == [1, 1, 1, 1] and tokenizer.tokenize("221")[1] != "2"

        assert "up to date" in dvc(project, "status", "collect").stdout
        appended = time.time()
        subprocess.run([sys.executable, str(EXAMPLE / "make_logs.py"), "--episodes", "50", "--seed", "9",
                        "--first-id", "5000", "--append", "--out", str(project / "domains/gitforge/episodes.jsonl")],
                       check=True, capture_output=True)
        status = dvc(project, "status").stdout  # DVC lists collect; what follows reruns once its output changes
        assert "collect:" in status and "modified:" in status and "domains/gitforge" in status

        done, _ = service.trigger()
        assert done.returncode == 0, done.stdout[-3000:] + service.logs()
        retrained = [stage for stage, out in STAGE_OUTPUTS.items() if (project / out).stat().st_mtime > appended]
        assert retrained == list(STAGE_OUTPUTS), f"only {retrained} reran on the appended logs"
        again = json.loads((project / "metrics/collect.json").read_text())["sources"]["gitforge"]
        assert again["episodes"] + again["dropped_unjudgeable"] == collected["episodes"] + collected["dropped_unjudgeable"] + 50
        assert json.loads((project / "metrics/register.json").read_text())["version"] == "2"
        client = MlflowClient(service.mlflow)
        assert {v.version for v in client.search_model_versions("name='gitforge-agent'")} == {"1", "2"}
    finally:
        service.stop()


STAGE_OUTPUTS = {"collect": "data/raw/episodes.jsonl", "prepare": "data/prepared/train.jsonl",
                 "warmup": "models/warmup/model.safetensors", "train@envace": "models/train/envace/model.safetensors",
                 "evaluate": "metrics/eval.json", "register": "metrics/register.json"}


def dvc(project: Path, *args: str) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "PATH": path})


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
