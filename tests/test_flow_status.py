"""`dvc status` started ahead of the flow (`envace run`, while its Prefect server boots): the flow
takes its answer only if the graph it looked at is still the graph."""

import subprocess
import sys

import pytest


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A DVC project of one stage, reproduced: nothing stale."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    dvc = lambda *args: subprocess.run([sys.executable, "-m", "dvc", *args], cwd=tmp_path, check=True,  # noqa: E731
                                       capture_output=True, text=True)
    dvc("init", "--no-scm", "-q")
    (tmp_path / "dvc.yaml").write_text("stages:\n  make:\n    cmd: echo a > out.txt\n    outs:\n      - out.txt\n")
    dvc("repro", "-q")
    return tmp_path


def test_the_flow_takes_the_status_started_ahead(scratch):
    from flows.full_pipeline import _STATUS_STARTED, get_ready, stale_stages

    get_ready(scratch)
    assert scratch in _STATUS_STARTED
    assert stale_stages(scratch) == set()
    assert scratch not in _STATUS_STARTED  # taken once: a later run asks DVC again


def test_a_graph_rewritten_after_the_status_started_is_asked_again(scratch):
    from flows.full_pipeline import _STATUS_STARTED, get_ready, stale_stages

    get_ready(scratch)
    _STATUS_STARTED[scratch][0].wait()  # it has answered for the graph as it was
    (scratch / "dvc.yaml").write_text("stages:\n  make:\n    cmd: echo b > out.txt\n    outs:\n      - out.txt\n")
    assert stale_stages(scratch) == {"make"}  # the early answer (nothing stale) is not the graph's now
