"""The pipeline as a service: `envace serve` (Prefect + MLflow servers on loopback, the
deployment `envace/full-pipeline`), triggered the way users trigger it, and the registry's
champion / challenger rule on a real MLflow store."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from flows.serve import free_port
from tests.conftest import ROOT, make_project

BIN = Path(sys.executable).parent


class Service:
    """`envace serve` in a child process on free loopback ports; `stop()` always cleans up."""

    def __init__(self, project: Path):
        self.project = project
        self.prefect_port, self.mlflow_port = free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.prefect_port}/api"
        self.mlflow = f"http://127.0.0.1:{self.mlflow_port}"
        self.env = {**os.environ, "PREFECT_HOME": str(project / ".prefect"), "PREFECT_PORT": str(self.prefect_port),
                    "MLFLOW_PORT": str(self.mlflow_port), "PREFECT_API_URL": self.api}
        self.env.pop("MLFLOW_TRACKING_URI", None)
        self.proc = None

    def start(self) -> None:
        self.log = open(self.project / "serve.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "envace.cli", "serve", "--project-dir", str(self.project)],
                                     cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"envace serve exited early:\n{self.logs()}"
            try:  # the API itself, asked often: a `prefect` command takes seconds to start
                with urllib.request.urlopen(f"{self.api}/deployments/name/envace/full-pipeline", timeout=5):
                    return
            except OSError:  # not listening yet, or 404: not deployed yet
                time.sleep(0.1)
        raise AssertionError(f"deployment envace/full-pipeline never appeared:\n{self.logs()}")

    def prefect(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "prefect"), *args], cwd=self.project, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def trigger(self) -> tuple[subprocess.CompletedProcess, float]:
        start = time.monotonic()
        done = self.prefect("deployment", "run", "envace/full-pipeline", "--watch", "--watch-timeout", "900", timeout=960)
        return done, time.monotonic() - start

    def logs(self) -> str:
        return (self.project / "serve.log").read_text(errors="replace")[-4000:]

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        servers_gone(self.prefect_port, self.mlflow_port)


def servers_gone(*ports: int, timeout: float = 60) -> None:
    """Wait until nothing listens on `ports` (the servers were stopped with serve)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listening = []
        for port in ports:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    listening.append(port)
        if not listening:
            return
        time.sleep(1)
    raise AssertionError(f"servers still listening on {listening} after serve stopped")


def fresh_clone(project: Path, clone: Path) -> Path:
    """What a git clone of the project holds: the pipeline files, DVC's config, and the outputs
    git tracks (metrics, reports, plots: `cache: false`); not the cached ones (data, models)."""
    clone.mkdir()
    tracked = [p.relative_to(project) for folder in ("metrics", "reports", "plots") for p in (project / folder).rglob("*")
               if p.is_file()]
    for name in ("dvc.yaml", "dvc.lock", "params.yaml", ".dvc/config", ".dvcignore", *tracked):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).write_bytes((project / name).read_bytes())
    (clone / "envace").symlink_to(ROOT / "envace")
    return clone


@pytest.mark.slow
def test_served_deployment_runs_the_pipeline_registers_and_survives_a_kill(tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from envace import tracking
    from tests.browser import check_mlflow_ui, check_prefect_task_logs

    project = make_project(tmp_path / "project")
    remote = tmp_path / "dvc-remote"
    subprocess.run([sys.executable, "-m", "dvc", "remote", "add", "-d", "local", str(remote)], cwd=project, check=True)
    service = Service(project)
    try:
        service.start()
        inspect = service.prefect("deployment", "inspect", "envace/full-pipeline").stdout
        assert "0 3 * * *" in inspect  # the schedule from params.yaml is registered

        done, _ = service.trigger()
        assert done.returncode == 0, done.stdout[-3000:] + service.logs()
        assert "Completed" in done.stdout

        # MLflow (through the server): one eval run per variant; the registry's aliases
        mlflow.set_tracking_uri(service.mlflow)
        client = MlflowClient()
        runs = mlflow.search_runs(experiment_names=["envace"], output_format="list")
        names = {r.info.run_name for r in runs}
        assert {"eval-sft", "eval-real_env", "eval-simulator", "eval-envace"} <= names
        champion = client.get_model_version_by_alias("envace-agent", "champion")
        challenger = client.get_model_version_by_alias("envace-agent", "challenger")
        assert str(champion.version) == str(challenger.version) == "1"
        assert champion.tags["data_version"] != "unknown" and champion.tags["params_md5"]
        # DVC: every stage pinned, the outputs pushed to the remote
        lock = (project / "dvc.lock").read_text()
        assert "register:" in lock and "train@envace:" in lock
        assert any(p.is_file() for p in remote.rglob("*")), "nothing was pushed to the DVC remote"
        clone = fresh_clone(project, tmp_path / "clone")
        pulled = subprocess.run([sys.executable, "-m", "dvc", "pull", "-q"], cwd=clone, capture_output=True, text=True)
        assert pulled.returncode == 0, pulled.stderr
        status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=clone, capture_output=True, text=True)
        assert "Data and pipelines are up to date" in status.stdout, status.stdout[-3000:]  # nothing would rerun
        for path in ("data/prepared/test.jsonl", "models/train/envace/model.safetensors", "models/warmup/model.safetensors"):
            assert (clone / path).read_bytes() == (project / path).read_bytes(), path
        # the registered champion loads by alias and runs a task
        task = json.loads((project / "data/prepared/test.jsonl").read_text().splitlines()[0])["task"]
        result = mlflow.pyfunc.load_model("models:/envace-agent@champion").predict(task)
        assert result[0]["task_id"] == task["id"] and result[0]["messages"]

        # nothing changed: the second run is quick, and its summary says so
        done, seconds = service.trigger()
        assert done.returncode == 0, done.stdout[-3000:]
        summary = service.prefect("artifact", "inspect", "pipeline-summary").stdout
        assert "Up to date: nothing changed" in summary
        print(f"second trigger with nothing changed: {seconds:.1f}s")

        # changed params: only the stale stages rerun; the same weights do not beat themselves
        params = yaml.safe_load((project / "params.yaml").read_text())
        params["evaluate"]["tasks"] = 10
        (project / "params.yaml").write_text(yaml.safe_dump(params))
        done, _ = service.trigger()
        assert done.returncode == 0, done.stdout[-3000:]
        summary = service.prefect("artifact", "inspect", "pipeline-summary").stdout
        assert "Retrained: evaluate, register, summary ran" in summary
        assert str(client.get_model_version_by_alias("envace-agent", "challenger").version) == "2"
        assert str(client.get_model_version_by_alias("envace-agent", "champion").version) == "1"

        # the browser: the served MLflow UI shows the variants' runs and the champion alias
        check_mlflow_ui(service.mlflow, "envace", ["eval-sft", "eval-real_env", "eval-simulator", "eval-envace",
                                                   "success", "rehearsal"],  # metric columns, shown
                        "envace-agent", "champion", tmp_path / "screenshots",  # by the flow's saved view
                        runs_query=f"?viewStateShareKey={tracking.VIEW}",
                        compare=(["eval-sft", "eval-envace"], ["success"]), version="1")
        # and the served Prefect UI shows a task run's stage log lines (the data gate's)
        check_prefect_task_logs(service.api, "data-gate", ["validate_data | "], tmp_path / "screenshots")

        # kill -9 the service, restart it: the stores are intact and the deployment runs again
        service.stop(signal.SIGKILL)
        service.start()
        mlflow.set_tracking_uri(service.mlflow)
        assert str(client.get_model_version_by_alias("envace-agent", "champion").version) == "1"
        assert len(mlflow.search_runs(experiment_names=["envace"], output_format="list")) >= len(runs)
        done, _ = service.trigger()
        assert done.returncode == 0, done.stdout[-3000:]
    finally:
        service.stop()


def test_serve_whose_prefect_server_cannot_start_says_so_and_leaves_nothing_running(tmp_path):
    """The three parts start together; one that fails stops the others, and one line names it."""
    project = make_project(tmp_path / "project", dvc=False)
    service = Service(project)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", service.prefect_port))
        taken.listen()
        out = subprocess.run([sys.executable, "-m", "envace.cli", "serve", "--project-dir", str(project)], cwd=ROOT,
                             env=service.env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 1
    assert re.search(rf"envace serve: prefect: exited with code \d+ before .*:{service.prefect_port}/api/health answered; "
                     "stopping everything", out.stderr), out.stderr[-2000:]
    # the MLflow server and the worker, started beside it, were stopped
    assert not [cmd for cmd in _command_lines() if str(project) in cmd or f"--port {service.mlflow_port}" in cmd]


def _command_lines() -> list[str]:
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # gone meanwhile
            pass
    return lines


def test_serve_refuses_a_bad_cron_naming_it(tmp_path):
    project = make_project(tmp_path / "project", dvc=False)
    params = yaml.safe_load((project / "params.yaml").read_text())
    (project / "params.yaml").write_text(yaml.safe_dump({**params, "serve": {"cron": "every night"}}))
    out = subprocess.run([sys.executable, "-m", "envace.cli", "serve", "--project-dir", str(project)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "every night" in out.stderr


def test_challenger_becomes_champion_only_when_better(tmp_path, prepared_dir, monkeypatch):
    """A real sqlite-backed registry: first version → champion; a worse one → challenger only;
    a better one → champion."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from envace.config import ModelConfig
    from envace.io import read_jsonl
    from envace.model import build_default, save
    from envace.registry import register
    from transformers import PreTrainedTokenizerFast

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/.mlflow/mlflow.db")
    monkeypatch.delenv("ENVACE_MLFLOW_RUN_ID", raising=False)
    (tmp_path / ".mlflow").mkdir()
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    tokenizer = PreTrainedTokenizerFast.from_pretrained(prepared_dir / "data/prepared/tokenizer")
    model_dir = save(build_default(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tokenizer),
                     tokenizer, tmp_path / "agent")
    tasks = [e["task"] for e in read_jsonl(prepared_dir / "data/prepared/test.jsonl")][:4]
    rollout = {"rollout": {"max_turns": 2, "max_new_tokens": 16}}

    first = register(model_dir, 0.0, 4, tasks, rollout, "agent", {"data_version": "d1"}, 0)
    assert first.promoted and first.reason == "no champion yet" and first.expectations == []
    # the champion is re-evaluated on the same tasks (an untrained model: 0 of 4)
    worse = register(model_dir, 0.0, 4, tasks, rollout, "agent", {"data_version": "d2"}, 0)
    assert not worse.promoted and worse.champion_success == 0.0 and worse.champion_version == "1"
    assert [e["success"] for e in worse.expectations] == [False, True, True]  # not better; same tasks; no more calls
    client = MlflowClient()
    assert str(client.get_model_version_by_alias("agent", "champion").version) == "1"
    assert str(client.get_model_version_by_alias("agent", "challenger").version) == "2"
    # better, but trained with real calls the champion did without: the suite holds it back
    costly = register(model_dir, 0.5, 4, tasks, rollout, "agent", {"data_version": "d3"}, 120)
    assert not costly.promoted and "no more real calls in training" in costly.reason
    assert [e["success"] for e in costly.expectations] == [True, True, False]
    better = register(model_dir, 0.5, 4, tasks, rollout, "agent", {"data_version": "d4"}, 0,
                      params={"train": {"steps": 3, "lr": 0.001}})
    assert better.promoted and str(client.get_model_version_by_alias("agent", "champion").version) == "4"
    version = client.get_model_version("agent", "4")
    assert version.tags["data_version"] == "d4" and version.tags["real_env_calls_train"] == "0"
    # the MLflow 3 logged model shows its success on the test set (the data version its digest) and its params
    logged = mlflow.get_logged_model(version.source.removeprefix("models:/"))  # the version's source: models:/<id>
    assert [(m.key, m.value, m.dataset_name, m.dataset_digest) for m in logged.metrics] == [("success", 0.5, "test", "d4")]
    assert logged.params == {"train.steps": "3", "train.lr": "0.001"}
    example = mlflow.models.Model.load("models:/agent/4").load_input_example()  # the version's input example
    assert json.loads(example["task"][0])["id"] == tasks[0]["id"]
    params_file = client.download_artifacts(better.run_id, "params.yaml", str(tmp_path))
    assert "steps: 3" in Path(params_file).read_text()
    # the same model, data and params again (a forced rerun): the same registration, no new version,
    # and nothing left in the temporary folder (the registration read back from the run)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporary"))
    (tmp_path / "temporary").mkdir()
    again = register(model_dir, 0.5, 4, tasks, rollout, "agent", {"data_version": "d4"}, 0,
                     params={"train": {"steps": 3, "lr": 0.001}})
    assert again == better and len(client.search_model_versions("name='agent'")) == 4
    assert not any((tmp_path / "temporary").iterdir())
    (model_dir / "generation_config.json").write_text("{}")  # other weights or files: a new version
    changed = register(model_dir, 0.5, 4, tasks, rollout, "agent", {"data_version": "d4"}, 0)
    assert changed.version == "5" and changed.champion_version == "4"
    # a success measured on other tasks than the champion is re-scored on is no comparison
    elsewhere = register(model_dir, 0.5, 5, tasks, rollout, "agent", {"data_version": "d5"}, 0)
    assert not elsewhere.promoted and "both were scored on the same number of test tasks" in elsewhere.reason
    assert [e["success"] for e in elsewhere.expectations] == [True, False, True]


def test_a_champion_with_unknown_training_calls_is_not_replaced_blindly():
    """A version registered without the real-calls tag (an older envace): the promotion
    suite's missing value fails the check rather than skipping it; so do unequal task counts."""
    from envace.gates import run_checks
    from envace.gates.promotion import checks, comparison

    table = comparison({"version": "2", "success": 0.9, "tasks": 10, "real_calls": 0},
                       {"version": "1", "success": 0.1, "tasks": 10, "real_calls": None})
    results = run_checks({"promotion": table}, checks())
    assert [r["success"] for r in results] == [True, True, False]
    assert table.loc[0, "challenger_ci_low"] > table.loc[0, "champion_ci_high"]  # the intervals travel with it
    different = comparison({"version": "2", "success": 0.9, "tasks": 10, "real_calls": 0},
                           {"version": "1", "success": 0.1, "tasks": 12, "real_calls": 0})
    assert [r["success"] for r in run_checks({"promotion": different}, checks())] == [True, False, True]


def test_a_challenger_level_with_the_champion_is_not_promoted_by_rounding():
    """The challenger's success comes from eval.json (4 places), the champion's is re-scored
    now: the same 714 of 797 tasks must compare equal, so the challenger stays challenger."""
    from envace.evaluate import rate
    from envace.gates import run_checks
    from envace.gates.promotion import checks, comparison

    outcomes = [True] * 714 + [False] * 83
    table = comparison({"version": "4", "success": 0.8959, "tasks": 797, "real_calls": 0},  # eval.json's figure
                       {"version": "3", "success": rate(outcomes), "tasks": 797, "real_calls": 0})
    assert [r["success"] for r in run_checks({"promotion": table}, checks())] == [False, True, True]


def _tiny_agent(tmp_path, prepared_dir, monkeypatch):
    """A 1-layer agent saved under tmp_path, with a sqlite MLflow store there."""
    import mlflow

    from envace.config import ModelConfig
    from envace.model import build_default, save
    from transformers import PreTrainedTokenizerFast

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENVACE_MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(prepared_dir / "data/prepared/tokenizer")
    return save(build_default(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tokenizer),
                tokenizer, tmp_path / "agent")


def test_the_registered_agent_decodes_greedily_as_evaluate_does(tmp_path, prepared_dir, monkeypatch):
    """The champion is re-evaluated through the registry: sampling there (the rollout's
    training temperature) would score it lower than `evaluate` scored the challenger. Its
    config holds `rollout.temperature`, a knob since removed: an older version still loads."""
    import mlflow

    from envace.io import read_jsonl
    from envace.registry import log_agent
    from envace.rollout.runner import Policy

    model_dir = _tiny_agent(tmp_path, prepared_dir, monkeypatch)
    _, uri = log_agent(model_dir, {"rollout": {"max_turns": 2, "max_new_tokens": 8, "temperature": 1.0}}, "agent", {})
    temperatures = []
    generate = Policy.generate
    monkeypatch.setattr(Policy, "generate", lambda self, prompts, n, temperature, *a: temperatures.append(temperature)
                        or generate(self, prompts, n, temperature, *a))
    tasks = [e["task"] for e in read_jsonl(prepared_dir / "data/prepared/test.jsonl")][:3]
    assert len(mlflow.pyfunc.load_model(uri).predict(tasks)) == 3
    assert temperatures and set(temperatures) == {0.0}


def test_a_registered_agent_carries_its_domain_folder(tmp_path, prepared_dir, monkeypatch):
    """Your own tools travel with the model: the folder is packed without its logs, so the version
    loads after the project folder is gone (another machine, a moved project)."""
    import shutil

    import mlflow

    from envace import domains
    from envace.registry import log_agent

    model_dir = _tiny_agent(tmp_path, prepared_dir, monkeypatch)
    folder = tmp_path / "project" / "gitforge"
    shutil.copytree(ROOT / "examples/gitforge/domains/gitforge", folder,
                    ignore=shutil.ignore_patterns("episodes.jsonl", "__pycache__"))
    (folder / "episodes.jsonl").write_text("logs stay with the project\n")
    _, uri = log_agent(model_dir, {"domains": [str(folder), "bank"]}, "agent", {})
    shutil.rmtree(tmp_path / "project")
    monkeypatch.setattr(domains, "_loaded", {})
    mlflow.pyfunc.load_model(uri)
    packed = domains.get_domain("gitforge")
    assert packed.backend_kind == "mcp" and {t.name for t in packed.tools} >= {"delete_branch", "merge_pull_request"}
    assert packed.policy.startswith("You are the gitforge assistant")
    assert not packed.logs.exists() and packed.logs.parent.is_dir()  # the tools came, the logs did not
    assert domains.get_domain("bank").name == "bank"
