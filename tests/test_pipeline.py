"""End to end: the Prefect flow over the DVC stages on a tiny profile, with MLflow."""

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from envace.project import import_closure
from tests.conftest import ROOT, TINY_PARAMS, make_project

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


def _dvc(project, *args):
    """`dvc ...` as a user runs it: stage commands find this venv's `python` on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=project, capture_output=True, text=True, env=env)


def _runs(project):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{project}/.mlflow/mlflow.db")
    return mlflow.search_runs(experiment_names=["envace"], output_format="list")


def _artifact(key):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return sorted(found, key=lambda a: a.created)[-1]


def test_flow_runs_stages_through_dvc_and_tracks_everything(tmp_path, prefect_api, monkeypatch):
    from flows.full_pipeline import envace_flow, pipeline_stages

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    project = make_project(tmp_path / "proj", copy_code=True)  # a copy of the package: the test edits it
    summary = envace_flow(project_dir=str(project))

    variants = ["train@sft", "train@real_env", "train@simulator", "train@envace"]
    assert list(summary["stages"]) == ["collect", "prepare", "validate_data", "base_model", "warmup", "rehearsal_gate", *variants,
                                       "evaluate", "rehearse", "register", "summary"]
    assert all(s["ran"] for s in summary["stages"].values())
    data = json.loads((project / "metrics/data.json").read_text())
    assert data["passed"] is True and data["domains"] == ["bank", "files", "trading"]

    # dvc.lock pins every declared output with a hash
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    declared = pipeline_stages(project)  # foreach expanded: train@sft, ...
    for stage, spec in declared.items():
        outs = {next(iter(o)) if isinstance(o, dict) else o
                for o in spec.get("outs", []) + spec.get("metrics", []) + spec.get("plots", [])}
        locked = {o["path"]: o["md5"] for o in lock[stage]["outs"]}
        assert outs == set(locked) and all(locked.values()), stage

    # one parent run, one nested run per stage with params, metrics and output hashes
    runs = _runs(project)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags and "variant" not in r.data.tags]
    children = {r.data.tags["mlflow.runName"]: r for r in runs
                if parents and r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id}
    assert len(parents) == 1 and set(children) == set(declared)
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children.values())
    collect = children["collect"].data
    assert collect.params["collect.tasks_per_domain"] == "40"
    assert 0 < collect.metrics["demonstrator_success"] < 1
    assert collect.tags["dvc.out.data/raw/episodes.jsonl"] == {o["path"]: o["md5"] for o in lock["collect"]["outs"]}["data/raw/episodes.jsonl"]
    assert children["validate_data"].data.metrics["passed"] == 1.0
    # one naming style, no duplicates, nothing constant by design (kl at kl_coef 0, clip_frac at 1 PPO epoch)
    grpo = children["train@envace"].data.metrics
    assert {"train/reward", "train/success", "wall_s", "steps"} <= set(grpo)
    assert not {"reward", "train/kl", "train/clip_frac", "train/real_calls"} & set(grpo)
    assert "real.success" not in children["warmup"].data.metrics and "real_success" in children["warmup"].data.metrics
    assert not [k for c in children.values() for k in c.data.params if "/" in k]  # params: section.key only

    # each gate's result is a Prefect markdown artifact
    assert _artifact("data-gate").data.startswith("# Data validation: PASSED")
    assert "gx/uncommitted/data_docs/local_site/gates.html" in _artifact("rehearsal-gate").data  # Data Docs linked
    kept = {p.name for p in (project / "gx/expectations").iterdir() if p.is_dir()}  # <gate>/<table>.json suites
    assert kept == {"validate_data", "rehearsal_gate"}  # the promotion suite runs once there is a champion
    assert _artifact("rehearsal-gate").data.startswith("# Rehearsal gate: PASSED")
    assert json.loads((project / "metrics/rehearsal.json").read_text())["passed"] is True
    # every variant evaluated in the real backends, one top-level MLflow run each (tagged with the stage's run)
    evaluated = json.loads((project / "metrics/eval.json").read_text())["variants"]
    assert set(evaluated) == {"sft", "real_env", "simulator", "envace"}
    assert evaluated["envace"]["real_env_calls_train"] == 0
    eval_runs = [r for r in runs if r.data.tags.get("stage") == "evaluate" and "variant" in r.data.tags]
    assert sorted(r.data.tags["variant"] for r in eval_runs) == ["envace", "real_env", "sft", "simulator"]
    assert {r.data.tags["stage_run"] for r in eval_runs} == {children["evaluate"].info.run_id}
    assert not any("mlflow.parentRunId" in r.data.tags for r in eval_runs)
    assert _artifact("evaluation").data.startswith("# Evaluation:")
    # the test-time half: budget curves for both models and modes, the guard table, 0 private real calls
    rehearse = json.loads((project / "metrics/rehearse.json").read_text())
    assert rehearse["private_real_calls"] == 0
    for model in ("sft", "envace"):
        for mode in ("parallel", "sequential"):
            points = rehearse["curve"][model][mode]
            assert list(points) == ["0", "1", "2"] and points["0"]["gain"] == 0.0
            assert set(points["2"]) == {"success", "gain", "gain_ci_low", "gain_ci_high", "n", "tokens_per_task",
                                        "real_calls_per_task"} and points["2"]["n"] == 6
        guard = rehearse["guard"][model]
        assert {"recall", "false_hold", "n_harmful", "n_safe"} <= set(guard["informed"]) <= set(guard["uninformed"])
        assert {"harmful_executed_on", "harmful_executed_off"} <= set(guard)
    assert _artifact("rehearse").data.startswith("# Test-time rehearsal and the guard")
    rehearse_run = children["rehearse"]  # the stage logs into the flow's run of it: numbers, report, PNG, traces
    assert rehearse_run.data.metrics["private_real_calls"] == 0
    import mlflow

    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(rehearse_run.info.run_id)}
    assert {"rehearse.md", "rehearse_budget.png"} <= logged
    traces = mlflow.search_traces(locations=[rehearse_run.info.experiment_id], run_id=rehearse_run.info.run_id,
                                  return_type="list")
    assert len(traces) == 6 and all(t.data.spans[0].name.startswith("episode ") for t in traces)
    # the agent registered: first version, so champion and challenger; the comparison published
    registered = json.loads((project / "metrics/register.json").read_text())
    assert registered["version"] == "1" and registered["promoted"] and registered["reason"] == "no champion yet"
    assert _artifact("registry").data.startswith("# register: envace-agent v1 promoted")
    assert "Retrained:" in _artifact("pipeline-summary").data
    _check_prefect_views(parents[0], children)
    # the parent run is the pipeline at a glance: gates, each variant's success, data version, stage links
    head = parents[0].data
    assert head.metrics["data_ok"] == 1.0 and head.metrics["gate_ok"] == 1.0  # the headline of metrics/summary.json
    assert set(evaluated) <= set(head.metrics)
    assert head.metrics["envace"] == round(evaluated["envace"]["success"], 4) and len(head.tags["data_version"]) == 32
    headline = json.loads((project / "metrics/summary.json").read_text())  # what `dvc metrics show` prints
    assert headline == {"rehearsal": round(json.loads((project / "metrics/rehearsal.json").read_text())["overall"], 4),
                        **{v: round(r["success"], 4) for v, r in evaluated.items()}, "real_calls": 0}
    assert all(head.metrics[k] == float(v) for k, v in headline.items()) and head.metrics["version"] == 1.0
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(children["register"].info.run_id)}
    assert {"register.json", "register.md"} <= logged  # each stage run keeps its metrics file and report
    drawn = {a.path for a in mlflow.MlflowClient().list_artifacts(children["warmup"].info.run_id)}
    assert {"warmup.json", "warmup_steps.png", "warmup_epochs.png"} <= drawn  # and its curves as PNGs
    on_parent = {a.path for a in mlflow.MlflowClient().list_artifacts(parents[0].info.run_id, "data_docs")}
    assert {"data_docs/index.html", "data_docs/gates.html"} <= on_parent  # the gates' Data Docs, logged
    stages_md = mlflow.MlflowClient().download_artifacts(parents[0].info.run_id, "stages.md", str(tmp_path))
    assert all(c.info.run_id in Path(stages_md).read_text() for c in children.values())

    # nothing changed: everything is up to date, and `dvc repro` agrees
    again = envace_flow(project_dir=str(project))
    assert not any(s["ran"] for s in again["stages"].values())
    assert "Up to date: nothing changed" in _artifact("pipeline-summary").data
    assert "Data and pipelines are up to date" in _dvc(project, "repro").stdout
    # every stage run again (the models reproduce): every tracked output is byte for byte the same,
    # the registry included (the same model is not registered twice), so `git status` stays clean
    tracked = lambda: {p: p.read_bytes() for d in ("metrics", "reports", "plots") for p in (project / d).rglob("*")  # noqa: E731
                       if p.is_file()} | {project / "dvc.lock": (project / "dvc.lock").read_bytes()}
    before = tracked()
    forced = _dvc(project, "repro", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "envace-agent v1 already is this model" in forced.stdout
    assert {str(p) for p, b in tracked().items() if before.get(p) != b} == set()

    # a corrupted prepared line fails the gate, naming the expectation and the line
    path = project / "data/prepared/train.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = lines[4][:-30]
    path.write_text("\n".join(lines) + "\n")
    failed = _dvc(project, "repro", "--single-item", "validate_data")
    assert failed.returncode != 0
    assert "every line is valid JSON" in failed.stderr and "train.jsonl:5" in failed.stderr
    # plain `dvc repro` restores the pinned file from the cache instead
    assert _dvc(project, "repro").returncode == 0
    assert path.read_text().splitlines()[4] != lines[4]

    # editing code makes exactly the stages that import it stale: none for a file no stage runs,
    # the rollout stages (not collect .. base_model) for the episode runner
    for edited in ("envace/act.py", "envace/rollout/runner.py"):
        (project / edited).write_text((project / edited).read_text() + "\n# edited\n")
        stale = set(re.findall(r"^(\S+):$", _dvc(project, "status").stdout, re.M))
        runs_it = {name for name, spec in declared.items()
                   if edited in import_closure(re.search(r"python -m (\S+)", spec["cmd"]).group(1))}
        assert stale == runs_it, edited
    assert runs_it and "collect" not in runs_it and "evaluate" in runs_it


def _check_prefect_views(parent, children) -> None:
    """The flow run has a readable name and links to its MLflow parent run and back; each task
    run carries its stage's log lines and the artifacts it made."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId

    flow_run_id = parent.data.tags["prefect.flow_run_id"]
    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        assert re.fullmatch(r"envace-\d{8}-\d{6}-\w+", flow_run.name) and parent.data.tags["mlflow.runName"] == flow_run.name
        gate = _artifact("data-gate")
        assert gate.task_run_id is not None and gate.flow_run_id == flow_run.id
        assert _artifact("evaluation").task_run_id is not None
        logs = client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[gate.task_run_id])))
        assert any("validate_data | " in log.message for log in logs)
    link = _artifact("mlflow-run")
    assert parent.info.run_id in link.data and link.flow_run_id == flow_run.id
    assert set(children) and all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children.values())


def test_failing_gate_stops_the_flow_and_reports(tmp_path, prefect_api, monkeypatch):
    from flows.full_pipeline import StageError, envace_flow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = json.loads(json.dumps(TINY_PARAMS))
    params["validate_data"]["min_split_sizes"]["train"] = 10_000
    project = make_project(tmp_path / "proj", params)
    with pytest.raises(StageError, match="every split has its minimum size"):
        envace_flow(project_dir=str(project))
    assert _artifact("data-gate").data.startswith("# Data validation: FAILED")
    assert "validate_data" not in yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    failed = [r for r in _runs(project) if r.data.tags.get("status") == "failed"]
    assert [r.data.tags["mlflow.runName"] for r in failed] == ["validate_data"]


def test_rehearsal_gate_above_one_stops_the_flow_naming_the_tools(tmp_path, prefect_api, monkeypatch):
    from flows.full_pipeline import StageError, envace_flow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = json.loads(json.dumps(TINY_PARAMS))
    params["gate"]["min_rehearsal_accuracy"] = 1.01
    project = make_project(tmp_path / "proj", params)
    with pytest.raises(StageError, match=r"(?s)stage 'rehearsal_gate' failed.*rehearsal gate failed: .*\w+ \(\d\.\d{3} < 1.01\)"):
        envace_flow(project_dir=str(project))
    assert _artifact("rehearsal-gate").data.startswith("# Rehearsal gate: FAILED")
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert "warmup" in lock and "rehearsal_gate" not in lock  # nothing past the gate is pinned
    assert not (project / "models/train").exists() and not (project / "metrics/eval.json").exists()
    assert json.loads((project / "metrics/rehearsal.json").read_text())["passed"] is False


def test_flow_stops_after_the_stage_it_is_told(tmp_path, prefect_api, monkeypatch):
    from flows.full_pipeline import StageError, envace_flow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    project = make_project(tmp_path / "proj")
    with pytest.raises(StageError, match="unknown stage 'trian' to run until; stages: collect, .*train, evaluate"):
        envace_flow(project_dir=str(project), until="trian")
    summary = envace_flow(project_dir=str(project), until="prepare")
    assert list(summary["stages"]) == ["collect", "prepare"]
    assert set(yaml.safe_load((project / "dvc.lock").read_text())["stages"]) == {"collect", "prepare"}


def test_pipeline_stages_expand_foreach_as_dvc_names_them(tmp_path):
    from flows.full_pipeline import StageError, pipeline_stages

    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "a": {"cmd": "echo a"},
        "t": {"foreach": ["x", "y"], "do": {"cmd": "run ${item}", "outs": ["m/${item}"]}},
    }}))
    assert pipeline_stages(tmp_path) == {"a": {"cmd": "echo a"}, "t@x": {"cmd": "run x", "outs": ["m/x"]},
                                         "t@y": {"cmd": "run y", "outs": ["m/y"]}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"t": {"foreach": {"x": 1}, "do": {"cmd": "c"}}}}))
    with pytest.raises(StageError, match="stage 't': the flow expands `foreach` over a list only"):
        pipeline_stages(tmp_path)


def test_cli_help_and_params_check(tmp_path):
    cli = [sys.executable, "-m", "envace.cli"]
    out = subprocess.run([*cli, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "run" in out.stdout
    bad = tmp_path / "params.yaml"
    bad.write_text((ROOT / "params.yaml").read_text().replace("  tasks_per_domain:", "  tasks_per_domian:", 1))
    out = subprocess.run([*cli, "check-params", "--params", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "collect.tasks_per_domian: unknown key" in out.stderr


def test_stage_entry_point_reports_bad_params_without_traceback(tmp_path):
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text().replace("  val_fraction: 0.1", "  val_fraction: two", 1))
    out = subprocess.run([sys.executable, "-m", "envace.stages.prepare"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 1
    assert "prepare.val_fraction" in out.stderr and "Traceback" not in out.stderr


def _cli_env(project: Path) -> dict:
    """`envace run` as a user starts it: this venv's tools on PATH, its own Prefect server and MLflow store."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PREFECT_HOME": str(project / ".prefect")}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def test_a_run_killed_between_stages_resumes_at_the_next_stage(tmp_path):
    """`envace run` (Prefect flow, DVC stages, its own Prefect server) kill -9'd as a stage is
    pinned in dvc.lock: the rerun finds every pinned stage up to date, keeps its outputs byte
    for byte, and runs only the rest."""
    import hashlib

    project = make_project(tmp_path / "proj")
    env = _cli_env(project)
    run = [sys.executable, "-m", "envace.cli", "run", "--project-dir", str(project), "--until", "base_model"]
    lock = project / "dvc.lock"
    pinned = lambda: set((yaml.safe_load(lock.read_text()) or {}).get("stages", {})) if lock.exists() else set()  # noqa: E731
    proc = subprocess.Popen(run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while "prepare" not in pinned() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    servers = _temporary_servers(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert servers, "envace run started no temporary Prefect server of its own"
    assert not _outliving(servers, deadline), "the temporary Prefect server outlived envace run"
    before = pinned()
    assert "prepare" in before and "base_model" not in before, f"killed too late or too early: {before}"
    digest = lambda: {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in (project / "data/prepared").glob("*.jsonl")}  # noqa: E731
    kept = digest()
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    status = dict(re.findall(r"^(\w+)\s+(ran|up to date)\s+[\d.]+$", out.stdout, re.M))
    assert all(status[s] == "up to date" for s in before), status
    assert status["base_model"] == "ran" and digest() == kept
    assert pinned() == {"collect", "prepare", "validate_data", "base_model"}


def _temporary_servers(parent: int) -> list[int]:
    """The pids of the Prefect servers (uvicorn) that process `parent` started."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields, cmdline = stat.read_text().rsplit(")", 1)[1].split(), (stat.parent / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == parent and b"prefect.server.api.server:create_app" in cmdline:
            found.append(int(stat.parent.name))
    return found


def _outliving(pids: list[int], deadline: float) -> list[int]:
    """Those of `pids` still alive at `deadline` (a server dies with its parent: SIGTERM on its death)."""
    while (alive := [pid for pid in pids if Path(f"/proc/{pid}").exists()]) and time.time() < deadline:
        time.sleep(0.05)
    return alive


def test_the_temporary_prefect_server_dies_with_envace_run(tmp_path):
    """`kill -9` of `envace run` alone (not its process group): its Prefect server goes too."""
    project = make_project(tmp_path / "proj")
    proc = subprocess.Popen([sys.executable, "-m", "envace.cli", "run", "--project-dir", str(project), "--until", "collect"],
                            env=_cli_env(project), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    try:
        while not (servers := _temporary_servers(proc.pid)) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert servers, "envace run started no temporary Prefect server of its own"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not _outliving(servers, deadline), "the server outlived envace run"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever else the run had started
        except ProcessLookupError:
            pass


def test_a_prefect_server_that_cannot_start_is_one_line_naming_why(tmp_path):
    """`envace run` starts its own temporary Prefect server; when that cannot start (here: its
    database cannot be opened), one line says so and why, and no stage runs."""
    project = make_project(tmp_path / "proj")
    env = _cli_env(project) | {"PREFECT_API_DATABASE_CONNECTION_URL": "sqlite+aiosqlite:////nonexistent/dir/prefect.db"}
    out = subprocess.run([sys.executable, "-m", "envace.cli", "run", "--project-dir", str(project), "--until", "collect"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "the temporary Prefect server" in last and "unable to open database file" in last, last
    assert "temporary-server.log" in last and not (project / "data" / "raw").exists()


def test_a_failed_gate_under_envace_run_ends_in_its_reasons_and_one_line_without_traceback(tmp_path):
    """The terminal of a run whose data gate fails: the stage's lines once, its failed
    expectations, then one closing line — no Prefect traceback, nothing said twice."""
    params = json.loads(json.dumps(TINY_PARAMS))
    params["validate_data"]["min_split_sizes"]["train"] = 10_000
    project = make_project(tmp_path / "proj", params)
    env = _cli_env(project)
    out = subprocess.run([sys.executable, "-m", "envace.cli", "run", "--project-dir", str(project), "--until",
                          "validate_data"], env=env, capture_output=True, text=True, timeout=900)
    terminal = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in terminal and "StageError" not in terminal, terminal[-4000:]
    assert out.stderr.strip().splitlines()[-1] == "envace run FAILED: stage 'validate_data' failed (dvc repro exit 255)"
    assert terminal.count("every split has its minimum size") == 1, terminal[-4000:]  # the failed expectation, once
    assert terminal.count("validate_data | validate_data: ") >= 1
