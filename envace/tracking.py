"""MLflow side effects in one place: the pipeline's parent run and one nested run per stage.

The store lives in the project: `sqlite:///<root>/.mlflow/mlflow.db` with artifacts in
`<root>/.mlflow/artifacts`, unless MLFLOW_TRACKING_URI says otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from envace.io import written

EXPERIMENT = "envace"


def local_store(root: Path) -> str:
    """The project's own MLflow store (what `envace serve`'s MLflow server serves)."""
    return f"sqlite:///{Path(root).resolve()}/.mlflow/mlflow.db"


def tracking_uri(root: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or local_store(root)


def artifact_location(root: Path) -> str:
    return (Path(root).resolve() / ".mlflow" / "artifacts").as_uri()


def create_local_store(root: Path) -> None:
    """Create the project's MLflow database, if missing, in one step: MLflow builds its tables
    under a temporary name (a few seconds of migrations on a first run), then the finished file is
    linked into place. A run stopped during those seconds leaves no half-migrated `mlflow.db`,
    on which every later run would fail (`table _alembic_tmp_datasets already exists`); linking,
    unlike a rename, never replaces a store another process created meanwhile."""
    db = Path(root).resolve() / ".mlflow" / "mlflow.db"
    if db.exists():
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    db.parent.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=db.parent, prefix="mlflow.db.", suffix=".tmp")
    os.close(fd)
    try:
        SqlAlchemyStore(f"sqlite:///{tmp}", artifact_location(root)).engine.dispose()
        try:
            os.link(tmp, db)
        except FileExistsError:
            pass  # another process finished first: its store is the one
    finally:
        os.unlink(tmp)


def experiment_id(root: Path) -> str:
    import mlflow

    uri = tracking_uri(root)
    if uri == local_store(root):
        create_local_store(root)
    mlflow.set_tracking_uri(uri)
    found = mlflow.get_experiment_by_name(EXPERIMENT)
    if found:
        return found.experiment_id
    return mlflow.create_experiment(EXPERIMENT, artifact_location=artifact_location(root))


# The runs table shows no metric column until one is picked; this saved view (an experiment tag
# in the format of MLflow's own "Save view") opens it with the headline columns, newest first:
# each variant run's held-out success and the parent runs' summary (metrics/summary.json).
VIEW = "envace-headline"
VIEW_COLUMNS = ("success", "ci_low", "ci_high", "real_env_calls_train", "rehearsal", "sft", "real_env", "simulator",
                "envace", "real_calls", "version")


def save_headline_view(exp_id: str) -> None:
    import base64
    import time
    import zlib

    import mlflow

    columns = [f"metrics.`{name}`" for name in VIEW_COLUMNS]
    state = {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False, "startTime": "ALL",
             "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
             "selectedColumns": columns, "columnOrder": columns, "columnWidths": {}, "runsHiddenMode": "SHOW_ALL",
             "viewMaximized": False, "runListHidden": False, "isAccordionReordered": False, "groupBy": None,
             "groupsExpanded": {}, "useGroupedValuesInCharts": True, "hideEmptyCharts": True}
    packed = "deflate;" + base64.b64encode(zlib.compress(json.dumps(state).encode())).decode()
    now = int(time.time() * 1000)
    view = {"name": "envace: headline numbers", "createdAt": now, "updatedAt": now, "state": packed}
    mlflow.MlflowClient().set_experiment_tag(exp_id, f"mlflow.sharedViewState.{VIEW}", json.dumps(view))


def runs_view_url(ui: str, exp_id: str) -> str:
    """The experiment's runs table in the MLflow UI at `ui`, opened on the headline view."""
    return f"{ui.rstrip('/')}/#/experiments/{exp_id}/runs?viewStateShareKey={VIEW}"


@contextmanager
def pipeline_run(root: Path, run_name: str, tags: dict[str, str]):
    """The parent run of one pipeline run; ends FAILED if the block raises."""
    import mlflow

    (Path(root) / ".mlflow").mkdir(exist_ok=True)
    exp_id = experiment_id(root)
    mlflow.set_experiment(experiment_id=exp_id)
    save_headline_view(exp_id)
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=tags) as run:
        yield run


@contextmanager
def stage_run(parent, stage: str):
    """A run for one stage nested under `parent` (the pipeline run); stages may log into it
    from their own process through ENVACE_MLFLOW_RUN_ID (e.g. Lightning's training curves)."""
    import mlflow

    with mlflow.start_run(experiment_id=parent.info.experiment_id, parent_run_id=parent.info.run_id, nested=True,
                          run_name=stage, tags={"stage": stage}) as run:
        yield run


@contextmanager
def variant_run(run_name: str, tags: dict[str, str]):
    """A top-level run for one evaluated variant, so the MLflow UI's run list shows the variants
    side by side (nested runs are folded under their parent there); inside the flow the tag
    `stage_run` names the stage's run (ENVACE_MLFLOW_RUN_ID)."""
    import mlflow

    root = Path.cwd()
    (root / ".mlflow").mkdir(exist_ok=True)
    stage_run_id = os.environ.get("ENVACE_MLFLOW_RUN_ID")
    with mlflow.start_run(experiment_id=experiment_id(root), run_name=run_name,
                          tags={**tags, **({"stage_run": stage_run_id} if stage_run_id else {})}) as run:
        yield run


def log_to_run(params: dict, metrics: dict, tags: dict, artifacts=()) -> None:
    """Params, metrics, tags and files for the active run."""
    import mlflow

    if params:
        mlflow.log_params({k: _param_value(v)[:6000] for k, v in params.items()})
    if metrics:
        mlflow.log_metrics(metrics)
    if tags:
        mlflow.set_tags(tags)
    for path in artifacts:
        source = written(path)  # a stage's own output is still staged until the stage ends
        if source.is_file() and source == Path(path):
            mlflow.log_artifact(str(path))
        elif source.is_file():
            with tempfile.TemporaryDirectory() as tmp:
                mlflow.log_artifact(shutil.copy(source, Path(tmp) / Path(path).name))


def csv_png(csv_path: Path, out_dir: Path) -> Path | None:
    """A stage's plot CSV as a PNG for its MLflow run: lines of every numeric column over the
    first (a step, an epoch), or bars of the second over a first column of names (variants).
    None for a CSV without rows."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    x, *ys = rows[0]
    over_numbers = _is_number(rows[0][x])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if over_numbers:
        for y in ys:
            ax.plot([float(r[x]) for r in rows], [float(r[y]) if _is_number(r[y]) else float("nan") for r in rows], label=y)
        ax.legend(fontsize="small")
    else:
        ax.barh([r[x] for r in rows], [float(r[ys[0]]) for r in rows])
    ax.set_xlabel(x if over_numbers else ys[0])
    ax.set_title(Path(csv_path).stem)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(out_dir) / f"{Path(csv_path).stem}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _param_value(value) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def flatten(obj, prefix: str = "", numbers_only: bool = False) -> dict:
    """{"a": {"b": 1}} → {"a.b": 1}; lists are kept whole (or dropped with numbers_only)."""
    out = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}.", numbers_only))
        elif not numbers_only:
            out[name] = value
        elif isinstance(value, (int, float)):  # bools count: a gate's "passed" is a metric
            out[name] = float(value)
    return out


def lightning_logger(run_name: str):
    """Lightning's MLflow logger on the project store; inside the flow it logs into the
    stage's own run (ENVACE_MLFLOW_RUN_ID)."""
    from lightning.pytorch.loggers import MLFlowLogger

    root = Path.cwd()
    return MLFlowLogger(experiment_name=EXPERIMENT, tracking_uri=tracking_uri(root), run_name=run_name,
                        run_id=os.environ.get("ENVACE_MLFLOW_RUN_ID"), artifact_location=artifact_location(root),
                        log_model=False)
