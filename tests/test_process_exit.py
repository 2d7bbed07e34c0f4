"""How a stage's process ends: as the interpreter would (threads, executors, exit handlers,
streams), less the teardown of the loaded libraries (`envace.finish`)."""

import os
import subprocess
import sys

# A stage whose run() leaves what libraries leave behind: an executor's idle worker (MLflow's
# artifact uploads), a thread still writing, an exit handler, and more output than a pipe buffers.
_STAGE = """
import atexit, os, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from envace.stages import main

def run(params):
    if os.environ.get("FAIL"):
        from envace.stages import StageFailed
        raise StageFailed("refused, as a gate does")
    global pool  # kept, as a library keeps its executor: its idle worker waits for the interpreter's exit
    pool = ThreadPoolExecutor(1)
    pool.submit(lambda: None).result()
    threading.Thread(target=lambda: (time.sleep(0.5), Path("thread.txt").write_text("joined"))).start()
    atexit.register(lambda: Path("atexit.txt").write_text("ran"))
    print("x" * 200_000)
    return {"out": "thread.txt"}

main(sys.argv.pop(1), run)
"""


def _stage(tmp_path, **env):
    from tests.conftest import TINY_PARAMS, write_params

    write_params(tmp_path / "params.yaml", TINY_PARAMS)
    return subprocess.run([sys.executable, "-c", _STAGE, "collect"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})


def test_a_stage_ends_after_its_threads_executors_and_exit_handlers_with_its_output_whole(tmp_path):
    out = _stage(tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "x" * 200_000 in out.stdout and "collect: done in" in out.stdout
    assert (tmp_path / "thread.txt").read_text() == "joined" and (tmp_path / "atexit.txt").read_text() == "ran"


def test_a_stage_that_refuses_ends_with_status_1_and_its_reason(tmp_path):
    out = _stage(tmp_path, FAIL="1")
    assert out.returncode == 1 and out.stderr.strip() == "collect: refused, as a gate does"


def test_the_envace_command_keeps_its_exit_status():
    out = subprocess.run([sys.executable, "-m", "envace.cli", "stage", "nonexistent"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "unknown stage 'nonexistent'" in out.stderr
