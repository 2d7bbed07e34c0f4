"""The `envace` Prefect flow: every DVC stage in order, gates reported, runs tracked.

Each stage runs through DVC (`dvc repro --single-item <stage>`: the flow has just run the
stages before it, in order, so DVC need not check them again), so DVC decides what is stale,
skips what is up to date and pins every artifact in dvc.lock. Around it the flow adds what
DVC does not: retries of nothing (stages are deterministic, a failure is real), a
markdown artifact per gate, and MLflow tracking — one parent run per pipeline run and a
nested run per stage with its params, metrics and the hashes of its outputs.

Run: `make run`, or `envace run`, or `python -m flows.full_pipeline`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

import yaml
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from envace import tracking, warm_start
from envace.config import load_params
from envace.gates import DATA_DOCS, GATE_RUNS
from envace.project import is_root, project_dvc_yaml

# stage -> (artifact key, report file): the stages whose result is a gate decision.
GATES = {
    "validate_data": ("data-gate", "reports/data_validation.md"),
    "rehearsal_gate": ("rehearsal-gate", "reports/rehearsal_gate.md"),
}
# stage -> (artifact key, report file): results published as Prefect markdown artifacts.
REPORTS = {"evaluate": ("evaluation", "reports/eval.md"), "rehearse": ("rehearse", "reports/rehearse.md"),
           "register": ("registry", "reports/register.md")}


class StageError(RuntimeError):
    """A stage failed or cannot run. `unseen`: the last lines of the stage's output that the
    terminal did not show as they came (a gate's failed expectations, a stage's traceback)."""

    def __init__(self, message: str, stage: str = "", unseen: tuple[str, ...] = ()):
        super().__init__(message)
        self.stage, self.unseen = stage, unseen


class _ReportedStageFailure(logging.Filter):
    """Keeps Prefect's traceback of a failed stage off the terminal, where the stage's own
    lines and `envace run`'s closing lines report it; the Prefect UI keeps the full record."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, StageError) and "StageError" not in record.getMessage()


def _quiet_stage_failures() -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(
                isinstance(f, _ReportedStageFailure) for f in handler.filters):
            handler.addFilter(_ReportedStageFailure())


def pipeline_stages(root: Path) -> dict[str, dict]:
    """The stages of dvc.yaml, in file order (which is the dependency order); a `foreach`
    stage becomes one stage per item, named as DVC names them (`train@envace`)."""
    stages = {}
    for name, spec in yaml.safe_load((root / "dvc.yaml").read_text())["stages"].items():
        if "foreach" not in spec:
            stages[name] = spec
            continue
        if not isinstance(spec["foreach"], list):
            raise StageError(f"dvc.yaml stage {name!r}: the flow expands `foreach` over a list only")
        for item in spec["foreach"]:
            stages[f"{name}@{item}"] = json.loads(json.dumps(spec["do"]).replace("${item}", str(item)))
    return stages


@task(name="dvc-repro", task_run_name="{stage}", log_prints=False)  # stage lines: terminal + logger
def reproduce(stage: str, root: Path, mlflow_run_id: str, up_to_date: bool = False, warm: dict | None = None) -> dict:
    """`dvc repro --single-item <stage>`; returns whether it ran (vs. up to date) and how long it took. A
    gate's or a result's report becomes a markdown artifact of this task run, failed or not.
    `up_to_date`: `dvc status` already said so (and nothing ran since): no `dvc repro` to start.
    `warm`: the environment that has the stage's command run by the flow's warm server."""
    logger = get_run_logger()
    if up_to_date:
        logger.info("%s | up to date (dvc status)", stage)
        _publish_report(stage, root)
        return {"stage": stage, "ran": False, "seconds": 0.0}
    try:
        return _reproduce(stage, root, mlflow_run_id, logger, warm or {})
    finally:
        _publish_report(stage, root)


def _reproduce(stage: str, root: Path, mlflow_run_id: str, logger, warm: dict) -> dict:
    env = {**os.environ, **warm}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # stage cmds use this python
    env["ENVACE_MLFLOW_RUN_ID"] = mlflow_run_id  # stages log curves into their nested run
    env["MLFLOW_TRACKING_URI"] = tracking.tracking_uri(root)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "--single-item", stage], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in proc.stdout:  # streamed: a long stage (warmup) shows its epochs as they end
        lines.append(line.rstrip())
        if lines[-1].strip() and "%|" not in line:  # progress-bar frames stay out of the log
            logger.info("%s | %s", stage, lines[-1])  # the Prefect UI: every line
            if for_terminal(stage, lines[-1]):  # the terminal: the stage's own lines (DVC's and Lightning's chatter stay in Prefect)
                print(f"{stage} | {lines[-1]}", flush=True)
    proc.wait()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = [line for line in lines[-25:] if line.strip()]
        unseen = tuple(line for line in tail  # what the terminal skipped, less DVC's chatter and progress bars
                       if not for_terminal(stage, line) and not DVC_CHATTER.match(line) and "%|" not in line)
        raise StageError(f"stage {stage!r} failed (dvc repro exit {proc.returncode}):\n" + "\n".join(tail),
                         stage, unseen)
    ran = any(f"Running stage '{stage}'" in line for line in lines)
    return {"stage": stage, "ran": ran, "seconds": round(seconds, 2)}


DVC_CHATTER = re.compile(r"(?:Stage '.*' didn't change, skipping|Running stage '.*':|> )")
OWN_LINE = re.compile(r"(?:(?P<name>[a-z_]+)(?:\[[\w-]+\])?: |epoch \d+ |ERROR)")


def for_terminal(stage: str, line: str) -> bool:
    """A line the stage itself printed (`warmup: ...`, `train[envace]: ...`, `epoch 3 (...)`) or an error."""
    match = OWN_LINE.match(line.strip())
    return bool(match) and match.group("name") in (None, stage.split("@")[0])


_STATUS_STARTED: dict[Path, tuple[subprocess.Popen, list[bytes]]] = {}  # by project: `dvc status` started ahead, on these files


def get_ready(root: Path) -> None:
    """Do ahead what the flow's first moments wait for: `envace run` calls it while its Prefect
    server boots (~2 s in which it would only wait). Starts `dvc status` for `stale_stages`, and
    imports MLflow and opens its store (~1.6 s)."""
    root = root.resolve()
    _STATUS_STARTED[root] = (_dvc_status(root), _graph_files(root))
    try:
        tracking.experiment_id(root)
    except Exception:  # noqa: BLE001 - the flow opens the store again and reports what fails, in Prefect too
        pass


def _dvc_status(root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dvc", "status", "--json"], cwd=root, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _graph_files(root: Path) -> list[bytes]:
    """What the flow may write before it asks `dvc status`: a project's dvc.yaml and .dvcignore."""
    return [p.read_bytes() if p.exists() else b"" for p in (root / "dvc.yaml", root / ".dvcignore")]


def stale_stages(root: Path) -> set[str] | None:
    """The stages `dvc status` finds changed — one DVC start for the whole graph instead of one
    per stage; None when it cannot tell (then every stage goes through `dvc repro`). Takes the
    status `get_ready` started, unless the flow has rewritten dvc.yaml or .dvcignore since (a
    project in its own folder, after a code change)."""
    proc, seen = _STATUS_STARTED.pop(root.resolve(), (None, []))
    if proc is not None and seen != _graph_files(root):
        proc.kill()
        proc.communicate()
        proc = None
    proc = proc or _dvc_status(root)
    stdout, _ = proc.communicate()
    if proc.returncode != 0:
        return None
    try:
        changed = json.loads(stdout or "{}")
    except json.JSONDecodeError:
        return None
    # this folder's dvc.yaml names its stages bare; other dvc.yaml files of the repository
    # (a project inside it, or the repository's around a project) come as "path/dvc.yaml:stage"
    return {key for key in changed if ":" not in key}


def _read_lock(root: Path) -> dict:
    """dvc.lock's stages (read after every stage: libyaml's loader, ~10x the pure-Python one)."""
    lock = root / "dvc.lock"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return (yaml.load(lock.read_text(), Loader=loader) or {}).get("stages", {}) if lock.exists() else {}


def _stage_params(spec: dict, params: dict) -> dict:
    out = {}
    for entry in spec.get("params", []):
        for key in ([entry] if isinstance(entry, str) else list(entry)):
            value = params
            for part in key.split("."):
                value = value[part]
            out.update(tracking.flatten(value, f"{key}.") if isinstance(value, dict) else {key: value})
    return out


def _stage_files(spec: dict, root: Path, folder: str) -> list[Path]:
    """The stage's declared output files under `folder` (metrics/, reports/) that exist."""
    paths = [root / (entry if isinstance(entry, str) else next(iter(entry)))
             for entry in spec.get("outs", []) + spec.get("metrics", [])]
    return [p for p in paths if p.is_file() and p.relative_to(root).parts[0] == folder]


def _stage_metrics(spec: dict, root: Path) -> dict:
    """A handful per stage: the top-level numbers of its metrics files (the detail per tool,
    task type or step stays in the file, which the stage's run keeps as an artifact)."""
    out = {}
    for path in _stage_files(spec, root, "metrics"):
        out.update(_top_numbers(path))
    return out


def _top_numbers(path: Path) -> dict:
    """The top-level numbers of a JSON file (bools count: a gate's "passed" is a metric)."""
    return {k: float(v) for k, v in json.loads(path.read_text()).items() if isinstance(v, (int, float))}


def _timings(root: Path, stage: str, ran: bool) -> dict:
    """The wall clock the stage recorded this time (`timings/<stage>.json`, kept out of git)."""
    path = root / "timings" / f"{stage}.json"
    return _top_numbers(path) if ran and path.exists() else {}


def _publish_report(stage: str, root: Path) -> None:
    """A gate's report (always: a missing one says so) or a result's report (when written) as
    a Prefect markdown artifact of the running task."""
    name = stage.split("@")[0]
    runs = root / GATE_RUNS
    link = f"\n\nGreat Expectations Data Docs, every gate's runs: [{runs}]({runs.as_uri()})\n" if runs.exists() else ""
    if name in GATES:
        key, report = GATES[name]
        path = root / report
        body = path.read_text() if path.exists() else f"# {stage}\n\nNo report was written."
        create_markdown_artifact(body + link, key=key, description=f"{stage} gate result")
    elif name in REPORTS and (root / REPORTS[name][1]).exists():
        key, report = REPORTS[name]
        create_markdown_artifact((root / report).read_text() + (link if name == "register" else ""), key=key,
                                 description=f"{stage} results")


def _record_gate(stage: str, root: Path, summary: dict) -> None:
    """Note a gate's verdict (the first line of its report) in the run summary."""
    if stage in GATES:
        path = root / GATES[stage][1]
        summary["gates"][stage] = path.read_text().splitlines()[0].lstrip("# ") if path.exists() else "no report"


def flow_run_name() -> str:
    """`envace-<UTC date and time>-<short git sha of the project>`: readable in the Prefect UI."""
    from prefect.runtime import flow_run

    root = Path(flow_run.parameters.get("project_dir", ".")).resolve()
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"envace-{stamp}-{sha.stdout.strip() if sha.returncode == 0 else 'nogit'}"


@flow(name="envace", flow_run_name=flow_run_name, log_prints=True)
def envace_flow(project_dir: str = ".", until: str | None = None) -> dict:
    """Run the stages of the pipeline through DVC, all of them or up to `until` (a stage
    name; a `foreach` stage's name covers all its items); returns a summary per stage."""
    import mlflow

    logger = get_run_logger()
    _quiet_stage_failures()
    root = Path(project_dir).resolve()
    loaded = load_params(root / "params.yaml")  # fails fast, naming any bad key
    params_raw = loaded.model_dump()
    if not is_root(root):  # a project in its own folder runs the repository's stages, re-rooted
        project_dvc_yaml(root, loaded.collect.domains)
    stages = pipeline_stages(root)
    if until is not None:
        names = [s.split("@")[0] for s in stages]
        if until not in names:
            raise StageError(f"unknown stage {until!r} to run until; stages: {', '.join(dict.fromkeys(names))}")
        last = len(names) - names[::-1].index(until)
        stages = dict(list(stages.items())[:last])
    summary: dict = {"stages": {}, "gates": {}}
    prefect_run = _prefect_run()
    with tracking.pipeline_run(root, prefect_run["name"], {"project_dir": str(root), **prefect_run["tags"]}) as parent, \
            ExitStack() as stack:
        summary["mlflow_run_id"] = parent.info.run_id
        _link_mlflow_run(root, parent)
        stale = stale_stages(root)
        # the stages' processes start warm: torch, transformers, Lightning, MLflow imported once
        warm = stack.enter_context(warm_start.server(str(root))) if stale is None or stale else {}
        for stage, spec in stages.items():
            # until a stage runs, nothing has changed since `dvc status` looked
            known_fresh = stale is not None and stage not in stale and not any(r["ran"] for r in summary["stages"].values())
            with tracking.stage_run(parent, stage) as run:
                params = _stage_params(spec, params_raw)
                try:
                    result = reproduce(stage, root, run.info.run_id, known_fresh, warm)
                except StageError:
                    _record_gate(stage, root, summary)
                    tracking.log_to_run(params, _stage_metrics(spec, root), {"status": "failed"},
                                        _stage_files(spec, root, "reports"))  # why a gate failed
                    raise
                lock = _read_lock(root).get(stage, {})
                hashes = {f"dvc.out.{o['path']}": o.get("md5", "") for o in lock.get("outs", [])}
                metrics = {**_stage_metrics(spec, root), **_timings(root, stage, result["ran"]),
                           "stage_seconds": result["seconds"], "stage_ran": float(result["ran"])}
                with tempfile.TemporaryDirectory() as tmp:  # its curves as PNGs (unless the stage drew its own)
                    drawn = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
                    pngs = [tracking.csv_png(p, Path(tmp)) for p in _stage_files(spec, root, "plots")
                            if p.suffix == ".csv" and f"{p.stem}.png" not in drawn]
                    tracking.log_to_run(params, metrics, {"status": "ok", **hashes},
                                        _stage_files(spec, root, "metrics") + _stage_files(spec, root, "reports")
                                        + [p for p in pngs if p])
            _record_gate(stage, root, summary)
            summary["stages"][stage] = result | {"mlflow_run_id": run.info.run_id}
            logger.info("%s: %s in %.1fs", stage, "ran" if result["ran"] else "up to date", result["seconds"])
            if not result["ran"]:
                print(f"{stage} | up to date", flush=True)
        _summarise_in_parent(root, parent, summary, loaded.registry.variant)
    if until is None and any(r["ran"] for r in summary["stages"].values()):
        summary["pushed"] = push(root)  # nothing ran: the outputs are the last run's, pushed then
    summary["model"] = _registered(root)
    create_markdown_artifact(_summary_markdown(summary), key="pipeline-summary", description="envace pipeline run")
    return summary


def _summarise_in_parent(root: Path, parent, summary: dict, agent: str) -> None:
    """The parent run shows the pipeline at a glance: data version, gate verdicts, each
    variant's success (runs table columns: the headline of `metrics/summary.json`, from the
    stages this run covered), and `stages.md` linking every stage's run."""
    import mlflow

    from envace.stages.register import data_version
    from envace.stages.summary import headline

    metrics = {k: float(v) for k, v in headline(root, agent, {s.split("@")[0] for s in summary["stages"]}).items()}
    rows = [f"| {stage} | {'ran' if r['ran'] else 'up to date'} | {r['seconds']:.1f} | "
            f"[{r['mlflow_run_id']}](#/experiments/{parent.info.experiment_id}/runs/{r['mlflow_run_id']}) |"
            for stage, r in summary["stages"].items()]
    table = "\n".join(["| stage | status | seconds | MLflow run |", "|---|---|---|---|", *rows])
    mlflow.log_metrics(metrics)
    mlflow.set_tags({"data_version": data_version(root / "dvc.lock"),
                     **{f"gate.{stage}": verdict for stage, verdict in summary["gates"].items()}})
    mlflow.log_text(f"# Stages of {parent.info.run_name}\n\n{table}\n", "stages.md")
    ran_a_gate = any(s.split("@")[0] in (*GATES, "register") for s, r in summary["stages"].items() if r["ran"])
    if ran_a_gate and (root / DATA_DOCS).exists():
        mlflow.log_artifacts(str((root / DATA_DOCS).parent), "data_docs")  # the gates' Data Docs, as built


def _prefect_run() -> dict:
    """This flow run's name, and tags that point back to it from MLflow (id and UI address)."""
    from prefect.runtime import flow_run

    tags = {"prefect.flow_run_id": str(flow_run.id), "prefect.flow_run_name": flow_run.name}
    if flow_run.ui_url:
        tags["prefect.flow_run_url"] = flow_run.ui_url
    return {"name": flow_run.name or "envace", "tags": tags}


def _link_mlflow_run(root: Path, run) -> None:
    """A Prefect link artifact to the MLflow parent run (its address in `make serve`'s MLflow UI)."""
    from prefect.artifacts import create_link_artifact

    mlflow_ui = f"http://127.0.0.1:{os.environ.get('MLFLOW_PORT', '5000')}"  # `make serve`'s MLflow server
    url = f"{mlflow_ui}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    create_link_artifact(url, link_text=f"MLflow run {run.info.run_name}", key="mlflow-run",
                         description=f"the pipeline's MLflow parent run {run.info.run_id} (store {tracking.tracking_uri(root)})")
    create_link_artifact(tracking.runs_view_url(mlflow_ui, run.info.experiment_id), link_text="MLflow runs: headline",
                         key="mlflow-runs", description="every run's headline numbers as columns (saved view)")


@task(name="dvc-push")
def push(root: Path) -> str:
    """`dvc push` to the default remote (.dvc/config; `dvc pull` restores a fresh clone)."""
    remote = subprocess.run([sys.executable, "-m", "dvc", "remote", "default"], cwd=root, capture_output=True, text=True)
    if remote.returncode != 0 or not remote.stdout.strip():
        return "no default DVC remote configured: nothing pushed"
    proc = subprocess.run([sys.executable, "-m", "dvc", "push", "-q"], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise StageError(f"dvc push to remote {remote.stdout.strip()!r} failed:\n{proc.stderr[-2000:]}")
    return f"pushed to DVC remote {remote.stdout.strip()!r}"


def _registered(root: Path) -> str | None:
    path = root / "metrics" / "register.json"
    if not path.exists():
        return None
    r = json.loads(path.read_text())
    return f"{r['model_name']} v{r['version']} ({'champion' if r['promoted'] else 'challenger; champion unchanged'})"


def _summary_markdown(summary: dict) -> str:
    ran = [s for s, r in summary["stages"].items() if r["ran"]]
    if ran:
        headline = f"Retrained: {', '.join(ran)} ran (DVC found them stale); the rest was up to date."
    else:
        headline = "Up to date: nothing changed (data, params, code), no stage ran; the model is current."
    if summary.get("model"):
        headline += f" Registered model: {summary['model']}."
    rows = [f"| {s} | {'ran' if r['ran'] else 'up to date'} | {r['seconds']:.1f} |" for s, r in summary["stages"].items()]
    gates = [f"- **{s}**: {g}" for s, g in summary["gates"].items()]
    pushed = [f"- DVC: {summary['pushed']}"] if summary.get("pushed") else []
    return "\n".join(["# envace pipeline", "", headline, "", "| stage | status | seconds |", "|---|---|---|", *rows, "",
                      *gates, *pushed]) + "\n"


if __name__ == "__main__":
    envace_flow()
