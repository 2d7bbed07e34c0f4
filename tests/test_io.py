"""Artifacts are never half-written: atomic files and folders, a stage's outputs committed
together, no temp file left by a killed writer, plain permissions."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest

from envace.io import atomic_dir, committed_together, write_json, write_text, written


class Boom(Exception):
    pass


class Verdict(Exception):
    pass


def test_outputs_of_a_block_replace_the_old_ones_all_together_or_not_at_all(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "out" / "b.txt"
    write_json(a, {"run": 0})
    write_text(b, "run 0")
    with pytest.raises(Boom), committed_together():
        write_json(a, {"run": 1})
        assert written(a) != a and (a.read_text().count('"run": 0') == 1)  # staged, not yet installed
        raise Boom  # before b is written: neither changes
    assert a.read_text().count('"run": 0') == 1 and b.read_text() == "run 0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "out"]  # no temp left
    with committed_together():
        write_json(a, {"run": 2})
        write_json(a, {"run": 3})  # a later write of the same file wins
        with atomic_dir(tmp_path / "model") as d:
            (d / "weights").write_text("w")
        write_text(b, "run 3")
    assert '"run": 3' in a.read_text() and b.read_text() == "run 3" and (tmp_path / "model/weights").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "model", "out"]


def test_a_gates_verdict_is_kept_when_it_fails(tmp_path):
    with pytest.raises(Verdict), committed_together(keep_on=Verdict):
        write_json(tmp_path / "gate.json", {"passed": False})
        raise Verdict("tool x below the threshold")
    assert '"passed": false' in (tmp_path / "gate.json").read_text()


def test_files_get_plain_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "f.txt", "x")
        with atomic_dir(tmp_path / "d"):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755


def test_a_killed_writer_leaves_a_temp_that_the_next_write_removes(tmp_path):
    target = tmp_path / "episodes.jsonl"
    code = ("import sys; from envace.io import atomic_writer\n"
            f"with atomic_writer({str(target)!r}) as f:\n"
            "    f.write('x' * 4096); f.flush(); print('writing', flush=True); sys.stdin.readline()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"  # mid-write, blocked until we kill it
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not target.exists() and len(list(tmp_path.glob(".episodes.jsonl.*"))) == 1
    write_text(target, "complete\n")
    assert [p.name for p in tmp_path.iterdir()] == ["episodes.jsonl"]


def test_a_stage_killed_between_its_outputs_replaces_none_of_them(prepared_dir, tmp_path):
    """prepare killed after its splits, before its tokenizer: the old splits stay beside the
    old tokenizer (no mix of two runs), and the rerun installs all of them."""
    import shutil

    from tests.conftest import TINY_PARAMS, write_params

    shutil.copytree(prepared_dir / "data", tmp_path / "data")
    def files():  # the artifacts, not the temps a killed writer leaves (the next write removes them)
        return {p: p.read_bytes() for p in (tmp_path / "data/prepared").rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(tmp_path).parts)}

    old = files()
    params = {**TINY_PARAMS, "prepare": {**TINY_PARAMS["prepare"], "seed": 1}}
    write_params(tmp_path / "params.yaml", params)
    # stop the stage right after the splits are written: the tokenizer is trained next
    stop = ("import os, signal, envace.stages.prepare as p\n"
            "real = p.train_tokenizer\n"
            "def killed(*a, **k): os.kill(os.getpid(), signal.SIGKILL)\n"
            "p.train_tokenizer = killed\n"
            "import sys; sys.argv = ['prepare']; from envace.stages import main; main('prepare', p.run)\n")
    proc = subprocess.run([sys.executable, "-c", stop], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert files() == old
    again = subprocess.run([sys.executable, "-m", "envace.stages.prepare"], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (tmp_path / "data/prepared/train.jsonl").read_bytes() != old[tmp_path / "data/prepared/train.jsonl"]
    assert not list((tmp_path / "data").rglob(".*")), "the killed run's temps are gone"


def test_a_run_stopped_while_mlflow_creates_its_store_leaves_none_and_the_next_run_creates_it(tmp_path, monkeypatch):
    import sqlalchemy
    from sqlalchemy.engine import Engine

    from envace import tracking
    from tests.conftest import mlflow_at

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def stop(conn, cursor, statement, *args):  # Ctrl-C inside a migration, its table copied and dropped
        if statement.lstrip().upper().startswith("ALTER TABLE _ALEMBIC_TMP_"):
            raise KeyboardInterrupt

    sqlalchemy.event.listen(Engine, "before_cursor_execute", stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            tracking.create_local_store(tmp_path)
    finally:
        sqlalchemy.event.remove(Engine, "before_cursor_execute", stop)
    assert os.listdir(tmp_path / ".mlflow") == []  # no half-migrated mlflow.db, no temp file

    with mlflow_at(tracking.local_store(tmp_path)) as mlflow:
        exp_id = tracking.experiment_id(tmp_path)
        with mlflow.start_run(experiment_id=exp_id) as run:
            mlflow.log_metric("success", 0.5)
        assert mlflow.get_run(run.info.run_id).data.metrics == {"success": 0.5}
    assert os.listdir(tmp_path / ".mlflow") == ["mlflow.db"]
