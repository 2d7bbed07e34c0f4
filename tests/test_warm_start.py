"""The flow's warm server: a stage's command run by a forked child of it, as if it ran itself."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from envace import warm_start
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def warm():
    """One server for the module, as the flow starts it; the environment its commands get."""
    with warm_start.server(str(ROOT)) as env:
        path = env[warm_start.VARIABLE]
        for _ in range(600):  # it listens once its imports are done
            if os.path.exists(path):
                break
            time.sleep(0.1)
        yield env


def _probe(env, *args, cwd=ROOT, **popen):
    return subprocess.Popen([sys.executable, "-m", "tests.warm_probe", *args], cwd=cwd, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _ran(proc) -> dict:
    return json.loads(proc.stdout.readline())


def test_a_command_runs_in_the_server_with_its_arguments_environment_streams_and_status(warm):
    proc = _probe({**warm, "PROBE": "seen"}, "--exit", "3")
    out, err = proc.communicate(timeout=60)
    ran = json.loads(out)
    assert proc.returncode == 3 and "probe: to stderr" in err
    assert ran["warm"] and ran["pid"] != proc.pid  # a forked child of the server, torch already imported
    assert ran["argv"] == ["--exit", "3"] and ran["probe"] == "seen"
    assert ran["server"] is None  # the child's own subprocesses start cold
    assert ran["pgid"] == os.getpgrp()  # in the command's process group (this one): a Ctrl-C reaches it


def test_a_stage_run_warm_writes_what_it_writes_cold(warm, tmp_path):
    """A real stage through the server: the same output bytes and the same lines as cold."""
    from tests.conftest import make_project

    project = make_project(tmp_path / "proj")
    for stage in ("collect", "prepare"):
        subprocess.run([sys.executable, "-m", f"envace.stages.{stage}"], cwd=project, check=True, capture_output=True)
    runs = {}
    with warm_start.server(str(project)) as env:
        while not os.path.exists(env[warm_start.VARIABLE]):
            time.sleep(0.1)
        for how, extra in (("cold", {}), ("warm", env)):
            done = subprocess.run([sys.executable, "-m", "envace.stages.base_model"], cwd=project, text=True,
                                  env={**os.environ, **extra}, capture_output=True)
            assert done.returncode == 0, done.stderr
            runs[how] = ({p.name: p.read_bytes() for p in (project / "models/base").iterdir()},
                         (project / "metrics/base_model.json").read_bytes(), re.sub(r"\d+(\.\d)?s\b", "Ns", done.stdout))
    assert runs["warm"] == runs["cold"]


def test_a_failing_stage_fails_the_same_way_warm(warm, tmp_path):
    """Bad input: one clear line on stderr and exit status 1, through the server as without it."""
    from tests.conftest import make_project

    project = make_project(tmp_path / "proj")
    with warm_start.server(str(project)) as env:
        while not os.path.exists(env[warm_start.VARIABLE]):
            time.sleep(0.1)
        done = {how: subprocess.run([sys.executable, "-m", "envace.stages.warmup"], cwd=project, text=True,
                                    env={**os.environ, **extra}, capture_output=True)
                for how, extra in (("cold", {}), ("warm", env))}
    assert done["warm"].returncode == done["cold"].returncode == 1
    assert done["warm"].stderr == done["cold"].stderr and "run the base_model stage first" in done["warm"].stderr


def test_killing_the_command_kills_the_stage(warm):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = _probe(warm, "--sleep", "60")
        child = _ran(proc)["pid"]
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig  # ends as the stage did: by that signal
        for _ in range(100):
            if not _alive(child):
                break
            time.sleep(0.1)
        assert not _alive(child), f"the stage outlived its command killed by {sig!r}"


def test_the_stage_dies_with_the_server():
    with warm_start.server(str(ROOT)) as env:
        while not os.path.exists(env[warm_start.VARIABLE]):
            time.sleep(0.1)
        proc = _probe(env, "--sleep", "60")
        child = _ran(proc)["pid"]
    # the block ended (the flow is done, or died): its server went, and the stage with it
    assert proc.wait(timeout=30) != 0 and "the warm server ended before the stage did" in proc.stderr.read()
    assert not _alive(child)


@pytest.mark.parametrize("why", ["load-time setting", "import path", "no server"])
def test_a_command_the_server_cannot_run_as_itself_starts_cold(warm, why, tmp_path):
    env, cwd = dict(warm), ROOT
    if why == "load-time setting":
        env["OMP_NUM_THREADS"] = "1"  # OpenMP read it as the server loaded torch: not this value
    elif why == "import path":
        cwd, env["PYTHONSAFEPATH"] = tmp_path, ""
        env["PYTHONPATH"] = str(ROOT)  # the same code, but found through another path
    else:
        env[warm_start.VARIABLE] = str(tmp_path / "gone")
    proc = _probe(env, "--exit", "0", cwd=cwd)
    out, err = proc.communicate(timeout=120)
    ran = json.loads(out)
    assert proc.returncode == 0 and not ran["warm"] and ran["pid"] == proc.pid
    if why != "no server":
        assert "tests.warm_probe: starts cold:" in err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, waiting to be reaped
        return stat.read().split(")")[-1].split()[0] != "Z"
