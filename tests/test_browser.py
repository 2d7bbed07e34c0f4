"""The MLflow UI, seen through headless Chromium: a real `mlflow server` on loopback, seeded
through the client, shows our runs and the registered model with its aliases."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from flows.serve import free_port
from tests.browser import check_mlflow_ui
from tests.conftest import mlflow_at

EXPERIMENT = "envace"
VARIANTS = {"sft": 0.30, "real_env": 0.45, "simulator": 0.55, "envace": 0.70}
MODEL = "envace-agent"


@pytest.fixture
def mlflow_server(tmp_path):
    """A real tracking server (sqlite + file artifacts under tmp_path); stopped on teardown."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    mlflow_cmd = [str(mlflow_bin)] if mlflow_bin.exists() else [sys.executable, "-m", "mlflow"]
    cmd = [
        *mlflow_cmd, "server",
        "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--default-artifact-root", (tmp_path / "artifacts").as_uri(),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"}
    with open(tmp_path / "mlflow-server.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {proc.returncode}:\n"
                                   + (tmp_path / "mlflow-server.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("mlflow server not healthy after 60 s:\n"
                                   + (tmp_path / "mlflow-server.log").read_text()[-3000:])
            time.sleep(0.25)
        yield url
    finally:
        # the server's own process group (uvicorn/gunicorn workers included)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        except ProcessLookupError:
            pass


def seed(url: str) -> dict[str, str]:
    """Experiment `envace` with one eval run per variant; `envace-agent` v1 (champion, from
    eval-sft) and v2 (challenger, from eval-envace). Returns run ids by run name."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url, registry_uri=url)
    exp_id = client.create_experiment(EXPERIMENT)
    runs = {}
    for variant, success in VARIANTS.items():
        run = client.create_run(exp_id, run_name=f"eval-{variant}")
        client.log_metric(run.info.run_id, "success", success)
        client.set_terminated(run.info.run_id)
        runs[run.info.run_name] = run
    client.create_registered_model(MODEL)
    for name in ("eval-sft", "eval-envace"):
        run = runs[name]
        client.create_model_version(MODEL, source=f"{run.info.artifact_uri}/model",
                                    run_id=run.info.run_id, await_creation_for=0)
    client.set_registered_model_alias(MODEL, "champion", "1")
    client.set_registered_model_alias(MODEL, "challenger", "2")
    assert client.get_model_version_by_alias(MODEL, "champion").run_id == runs["eval-sft"].info.run_id
    return {name: run.info.run_id for name, run in runs.items()}


SPANS = ["private rehearsal 1", "ACT", "REHEARSE get_balance", "TOOL get_balance", "GUARD transfer"]


def seed_trace(url: str) -> str:
    """An episode as `envace act` logs it: one private rehearsal, then the real episode whose
    transfer the guard held (spans for ACT, REHEARSE, TOOL and GUARD)."""
    from envace.domains import get_domain
    from envace.domains.base import Checklist, Task
    from envace.rehearsal.guard import Verdict
    from envace.rehearsal.trace import log_trace
    from envace.rollout.runner import Episode

    task = Task("t-1", "bank", "transfer_insufficient", "Send 100 from Alice to Bob.", get_domain("bank").schemas(),
                {"accounts": []}, Checklist([]))
    balance = {"name": "get_balance", "arguments": {"account_id": "A12"}}
    transfer = {"name": "transfer", "arguments": {"from_account": "A12", "to_account": "A34", "amount": 100}}

    def episode(source, held):
        messages = [{"role": "user", "content": task.request}, {"role": "act", "calls": [balance]},
                    {"role": "tool", "name": "get_balance", "response": {"balance": 40}, "source": source},
                    {"role": "act", "calls": [transfer], **({"held": [0]} if held else {})},
                    {"role": "tool", "name": "transfer", "response": {"error": {"code": "held"}},
                     "source": "guard" if held else source},
                    {"role": "act", "answer": "Cannot send."}]
        return Episode(task, messages)

    real = episode("real", held=True)
    real.reviews.append(Verdict(transfer, {"status": "completed"}, ["the balance of from_account is at least amount"],
                                hold=True, reason="precondition false"))
    with mlflow_at(url) as mlflow:
        mlflow.set_experiment(EXPERIMENT)
        return log_trace(real, [episode("rehearsed", held=False)], "envace")


@pytest.mark.slow
def test_mlflow_ui_shows_runs_model_and_an_episode_trace(chromium, mlflow_server, tmp_path):
    runs = seed(mlflow_server)
    trace_id = seed_trace(mlflow_server)
    out = tmp_path / "screenshots"
    try:
        result = check_mlflow_ui(mlflow_server, EXPERIMENT, list(runs), MODEL, "champion", out,
                                 trace=(trace_id, SPANS))
    finally:
        target = os.environ.get("ENVACE_SCREENSHOTS")
        if target and out.is_dir():  # kept for a human look, pass or fail
            shutil.copytree(out, target, dirs_exist_ok=True)
    assert "challenger" in result["model_text"]
    assert result["experiment_url"].endswith(f"#/experiments/{result['experiment_id']}/runs")
