"""Shared fixtures. The environment is made local and quiet before anything imports
Prefect, MLflow or DVC (the Makefile sets the same; this covers a bare `pytest`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect-test"))
from envace import env  # noqa: E402

env.configure(ROOT)

# A tiny profile: the whole data pipeline in seconds.
TINY_PARAMS = {
    "collect": {"seed": 0, "domains": ["bank", "files", "trading"], "tasks_per_domain": 40},
    "prepare": {"seed": 0, "val_fraction": 0.1, "test_fraction": 0.2},
    "validate_data": {
        "min_split_sizes": {"train": 50, "val": 3, "test": 10},
        "max_split_share_error": 0.15,
        "max_domain_share_error": 0.3,
    },
    "model": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64},
    "rollout": {"max_turns": 4, "max_new_tokens": 48, "batch_size": 32},
    "warmup": {"max_epochs": 1, "min_epochs": 1, "batch_size": 16, "eval_tasks": 12, "warmup_steps": 5},
    "gate": {"min_rehearsal_accuracy": 0.0, "min_tool_examples": 0},  # open: a tiny test split lacks rare tools
    "train": {"steps": 2, "tasks_per_step": 3, "group_size": 2, "memory_examples": 32},
    "rehearse": {"tasks": 6, "budgets": [0, 1, 2]},
}


def write_params(path: Path, params: dict) -> Path:
    """A params file with every section written out (defaults filled in), as envace requires."""
    from envace.config import parse_params

    path.write_text(yaml.safe_dump(parse_params(params).model_dump()))
    return path


def make_project(path: Path, params: dict = TINY_PARAMS, dvc: bool = True, copy_code: bool = False) -> Path:
    """A throwaway project dir: our dvc.yaml, the given params (every section written out),
    `dvc init --no-scm`; the package linked (or copied, for a test that edits it)."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "dvc.yaml", path / "dvc.yaml")
    # every section written out (defaults filled in): DVC needs each section a stage lists
    from envace.config import parse_params

    (path / "params.yaml").write_text(yaml.safe_dump(parse_params(params).model_dump()))
    # stage deps name source files: link the package so DVC can hash them
    if copy_code:
        shutil.copytree(ROOT / "envace", path / "envace", ignore=shutil.ignore_patterns("__pycache__"))
    else:
        (path / "envace").symlink_to(ROOT / "envace")
    if dvc:
        subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=path, check=True)
        subprocess.run([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], cwd=path, check=True)
    return path


@contextmanager
def mlflow_at(uri: str):
    """MLflow's fluent API pointed at `uri` for the block, then back as it was (tracking URI and
    active experiment are process globals: a later test must not log into a stopped server)."""
    import mlflow
    from mlflow.tracking import fluent

    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")}
    mlflow.set_tracking_uri(uri)
    try:
        yield mlflow
    finally:
        mlflow.set_tracking_uri(saved["MLFLOW_TRACKING_URI"])  # None unsets it
        fluent._active_experiment_id = None
        if saved["MLFLOW_EXPERIMENT_ID"] is None:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        else:
            os.environ["MLFLOW_EXPERIMENT_ID"] = saved["MLFLOW_EXPERIMENT_ID"]


@pytest.fixture
def tiny_params():
    from envace.config import parse_params

    return parse_params(TINY_PARAMS)


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory):
    """collect + prepare on the tiny profile, once per session (read-only for tests)."""
    from envace.config import parse_params
    from envace.stages import collect, prepare

    root = tmp_path_factory.mktemp("prepared")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        params = parse_params(TINY_PARAMS)
        collect.run(params)
        prepare.run(params)
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture(scope="module")
def chromium():
    """Debian's chromium for the browser checks (installed when missing); `make test` requires it
    (ENVACE_REQUIRE_BROWSER=1), a bare `pytest` skips those checks without it."""
    from tests.browser import install_chromium

    binary = install_chromium()
    if binary is None:
        msg = "chromium is not installed and cannot be installed (apt-get install -y chromium)"
        if os.environ.get("ENVACE_REQUIRE_BROWSER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return binary
