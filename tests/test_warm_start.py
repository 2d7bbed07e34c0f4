"""The flow's warm server: a stage's command run by a forked child of it, as if it ran itself."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from envace import warm_start
from tests.conftest import ROOT


def _until(condition, failure: str, seconds: float = 60) -> None:
    """Wait for `condition()`; fail with `failure` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{failure} within {seconds:.0f} s")
        time.sleep(0.05)


@contextmanager
def _started(root):
    """A warm server for `root`, as the flow starts one, once it listens (its imports done)."""
    with warm_start.server(str(root)) as env:
        _until(lambda: os.path.exists(env[warm_start.VARIABLE]), "the warm server did not listen")
        yield env


@pytest.fixture(scope="module")
def warm():
    """One server for the module: the environment its commands get."""
    with _started(ROOT) as env:
        yield env


def _probe(env, *args, cwd=ROOT):
    """`python -m tests.warm_probe ARGS` as DVC would start a stage's command."""
    return subprocess.Popen([sys.executable, "-m", "tests.warm_probe", *args], cwd=cwd, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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


def test_a_stage_run_warm_writes_what_it_writes_cold(tmp_path):
    """A real stage through the server: the same output bytes and the same lines as cold."""
    from tests.conftest import make_project

    project = make_project(tmp_path / "proj")
    for stage in ("collect", "prepare"):
        subprocess.run([sys.executable, "-m", f"envace.stages.{stage}"], cwd=project, check=True, capture_output=True)
    runs = {}
    with _started(project) as env:
        for how, extra in (("cold", {}), ("warm", env)):
            done = subprocess.run([sys.executable, "-m", "envace.stages.base_model"], cwd=project, text=True,
                                  env={**os.environ, **extra}, capture_output=True)
            assert done.returncode == 0, done.stderr
            runs[how] = ({p.name: p.read_bytes() for p in (project / "models/base").iterdir()},
                         (project / "metrics/base_model.json").read_bytes(), re.sub(r"\d+(\.\d)?s\b", "Ns", done.stdout))
    assert runs["warm"] == runs["cold"]


def test_a_failing_stage_fails_the_same_way_warm(tmp_path):
    """Bad input: one clear line on stderr and exit status 1, through the server as without it."""
    from tests.conftest import make_project

    project = make_project(tmp_path / "proj")
    with _started(project) as env:
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
        _until(lambda: not _alive(child), f"the stage outlived its command killed by {sig!r}", 10)


def test_the_stage_dies_with_the_server():
    with _started(ROOT) as env:
        proc = _probe(env, "--sleep", "60")
        child = _ran(proc)["pid"]
    # the block ended (the flow is done, or died): its server went, and the stage with it
    assert proc.wait(timeout=30) != 0 and "the warm server ended before the stage did" in proc.stderr.read()
    assert not _alive(child)


@pytest.mark.parametrize("group", [False, True], ids=["the flow", "its process group"])
def test_a_server_whose_flow_is_killed_leaves_nothing_behind(group):
    """The flow kill -9'd while its server imports, alone or with its whole process group (as a
    test or a supervisor kills a run): the server goes, and its socket's folder."""
    script = ("import sys\nfrom envace import warm_start\nwith warm_start.server(sys.argv[1]) as env:\n"
              "    print(env[warm_start.VARIABLE], flush=True)\n    sys.stdin.read()\n")  # until killed
    flow = subprocess.Popen([sys.executable, "-c", script, str(ROOT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    folder = os.path.dirname(flow.stdout.readline().strip())
    _until(lambda: _child_handles_sigterm(flow.pid), "the server did not start")  # and now imports
    if group:
        os.killpg(flow.pid, signal.SIGKILL)
    else:
        flow.kill()
    flow.wait()
    _until(lambda: not os.path.exists(folder), "the socket's folder outlived the flow", 10)


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


@pytest.mark.parametrize("code", ["the same", "edited"])
def test_a_command_from_a_copy_of_the_project_runs_warm_only_when_its_code_is_the_servers(warm, code, tmp_path):
    """DVC runs an experiment's stages in a copy of the project (`make seeds`): the server takes
    a command from there when the envace it would import is byte for byte the server's, and runs
    what is not imported yet from the copy; a copy with other code starts cold, naming it."""
    copy = tmp_path / "experiment"
    shutil.copytree(ROOT / "envace", copy / "envace", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tests").mkdir()
    for name in ("__init__.py", "warm_probe.py"):
        shutil.copy(ROOT / "tests" / name, copy / "tests" / name)
    if code == "edited":
        (copy / "envace/act.py").write_text((copy / "envace/act.py").read_text() + "\n# edited\n")
    proc = _probe(warm, "--exit", "0", cwd=copy)
    out, err = proc.communicate(timeout=120)
    ran = json.loads(out)
    assert proc.returncode == 0 and ran["file"] == str(copy / "tests/warm_probe.py")
    assert ran["warm"] == (code == "the same") and (ran["pid"] != proc.pid) == ran["warm"]
    if code == "edited":
        assert f"tests.warm_probe: starts cold: another copy of the code ({copy / 'envace'})" in err


def test_code_edited_after_the_server_started_runs_cold(tmp_path):
    """The server imported the code once: a stage after an edit (mid-run) must not run the old
    preloaded modules beside the edited ones, so it starts cold, saying why."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "envace", project / "envace", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", project / "tests", ignore=shutil.ignore_patterns("__pycache__", "test_*"))
    with _started(project) as env:
        before = _probe(env, cwd=project)
        assert json.loads(before.communicate(timeout=120)[0])["warm"]
        (project / "envace/act.py").write_text((project / "envace/act.py").read_text() + "\n# edited\n")
        after = _probe(env, cwd=project)
        out, err = after.communicate(timeout=120)
    assert not json.loads(out)["warm"] and "tests.warm_probe: starts cold: its code changed since the server imported it" in err


def _child_handles_sigterm(parent: int) -> bool:
    """Whether a child of `parent` has a SIGTERM handler of its own (the server, past its start)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:  # gone meanwhile
            continue
        if int(fields["PPid"]) == parent and int(fields["SigCgt"], 16) >> (signal.SIGTERM - 1) & 1:
            return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, waiting to be reaped
        return stat.read().split(")")[-1].split()[0] != "Z"
