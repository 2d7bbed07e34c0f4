"""Stage processes that start warm: the heavy libraries imported once per pipeline run.

A model stage's process spends 3-6 s importing torch, transformers, Lightning, MLflow and
Great Expectations before it does any work: ~50 s of a `make run`, and most of a stage's
time on a small profile. So the flow starts one *warm server* that imports them once, and
forks a child of it for each stage. DVC still runs each stage's own command (`python -m
envace.stages.<stage>`); that command, finding `ENVACE_WARM_SERVER` set, hands its module,
arguments, working folder, environment, CPU affinity, process group and standard streams to
the server, whose forked child runs the stage with them; the command waits and exits with
the child's status, as if it had run the stage itself. Without the variable (`dvc repro` by
hand, a stage run by hand), or when the server cannot take it, the command runs the stage
itself.

The child is the command's stand-in: it joins the command's process group (a Ctrl-C or a
killed group reaches it), takes a SIGTERM sent to the command, kills itself when the command
dies (the socket between them closes) and dies with the server, which dies with the flow.
A child never hands a command of its own to the server: its own subprocesses (Lightning's
ranks) start cold. A command from another folder (a DVC experiment's copy of the project, as
`make seeds` runs them) is served when only that folder differs in its import path and the
`envace` package it would import is byte for byte the server's; another copy of the code
starts cold, and so does any command once the code has been edited since the server imported
it (a stage never runs half old, half new code). A command whose environment differs from the server's in what the
libraries read as they load (OpenMP's and MKL's settings, torch's, Hugging Face's, CUDA's)
runs cold too, and so does every stage on a machine with a GPU, which may not be forked once
CUDA is initialised (and whose stages dwarf their imports).
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import envace
from envace.io import folder_digest

VARIABLE = "ENVACE_WARM_SERVER"
PRELOAD = (  # what the model stages import, heaviest first; a stage module itself stays out (runpy runs it)
    "torch", "transformers", "transformers.models.llama.modeling_llama", "lightning.pytorch", "mlflow",
    "mlflow.store.tracking.sqlalchemy_store", "great_expectations", "great_expectations.expectations",
    "envace.model", "envace.rollout.runner", "envace.train.warmup", "envace.train.grpo", "envace.tracking",
)
# environment variables the libraries read as they load (the server loaded them with its own values)
LOAD_TIME = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "PYTORCH_", "TORCH_", "HF_", "TRANSFORMERS_",
             "CUDA_", "LD_", "PYTHON", "MLFLOW_ENABLE", "ENVACE_CORES")
MESSAGE = 1 << 20  # the largest request: a command's environment


def gpu_present() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/dxg")


def _load_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(LOAD_TIME) and k != VARIABLE}


@contextmanager
def server(root: str):
    """A warm server for the stages run inside the block: yields the environment a stage's
    command needs to use it ({} where stages start cold: a GPU, or ENVACE_WARM_START=0).
    `root`: the folder DVC runs the stages in, so that the server imports what they would (a
    project's own copy of the code). It prints nothing unless a library fails to preload."""
    if gpu_present() or os.environ.get("ENVACE_WARM_START", "1") == "0":
        yield {}
        return
    import shutil
    import subprocess
    import tempfile

    folder = tempfile.mkdtemp(prefix="envace-warm-")  # a socket's path must be short (108 bytes)
    path = os.path.join(folder, "socket")
    # its own process group: a kill -9 of the flow's group leaves it the SIGTERM of its parent's
    # death, on which it removes the folder (its children still join each command's group)
    proc = subprocess.Popen([sys.executable, "-m", "envace.warm_start", path, str(os.getpid())], cwd=root,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, process_group=0)
    try:
        yield {VARIABLE: path}
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


# ---- the command's side -------------------------------------------------------------------

def run_in_server() -> int | None:
    """Run this process's command (`python -m <module> ...`) in the warm server named by
    ENVACE_WARM_SERVER: its exit status, or None when there is no server to take it."""
    path = os.environ.get(VARIABLE)
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if not path or spec is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
        streams = [fd for fd in (0, 1, 2) if _is_open(fd)]
        request = {"module": spec.name, "argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ),
                   "executable": sys.executable, "path": sys.path,
                   "cpus": sorted(os.sched_getaffinity(0)), "pgid": os.getpgrp(), "streams": streams}
        passed = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", streams))] if streams else []
        sock.sendmsg([json.dumps(request).encode()], passed)
        reply = json.loads(sock.recv(MESSAGE) or b"{}")
    except OSError:
        return None
    if "pid" not in reply:
        if reply.get("cold"):  # in the stage's log (Prefect's), not on the flow's terminal
            print(f"{spec.name}: starts cold: {reply['cold']}", file=sys.stderr, flush=True)
        return None
    child = reply["pid"]
    forward = lambda signum, frame: _signal(child, signum)  # noqa: E731
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    # a Ctrl-C reaches the child with the process group it joined; else pass it on
    signal.signal(signal.SIGINT, signal.SIG_IGN if reply.get("joined") else forward)
    try:
        done = sock.recv(MESSAGE)  # a forwarded signal does not interrupt it (PEP 475)
    except OSError:
        done = b""
    if not done:
        print(f"{spec.name}: the warm server ended before the stage did", file=sys.stderr)
        return 1
    code = os.waitstatus_to_exitcode(json.loads(done)["status"])
    if code < 0:  # killed by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


# ---- the server's side --------------------------------------------------------------------

def serve(path: str, parent: int) -> None:
    """Import PRELOAD, then listen at `path` and fork a child for each command that connects,
    one at a time (the flow runs one stage at a time; a child never connects). The socket
    appears once the imports are done: a command that comes earlier runs cold, not waiting.
    Dies with `parent`, removing the socket's folder."""
    folder = os.path.dirname(path)

    def leave(signum, frame):  # the flow is done, or died: nothing of the server's stays behind
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    _die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # it died before that took hold
        leave(signal.SIGTERM, None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the stage and the flow
    import importlib

    before, import_path = dict(os.environ), list(sys.path)  # as a command has them at its start
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as err:  # only a head start is lost: the stage imports it itself
            print(f"warm server: {name} not preloaded ({type(err).__name__}: {err})", file=sys.stderr, flush=True)
    # what a command must share with the server to be run by it
    package = Path(envace.__file__).parent
    same = {"executable": sys.executable, "path": import_path, "env": _load_time_env(before),
            "package": package, "code": folder_digest(package)}
    # what the imports set for themselves (Lightning: PYTORCH_NVML_BASED_CUDA_CHECK), as a cold stage's would
    set_by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(8)
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                _handle(conn, listener, same, set_by_imports)
            except OSError as err:  # the command died while being served: nothing to answer
                print(f"warm server: {err}", file=sys.stderr, flush=True)


def _handle(conn: socket.socket, listener: socket.socket, same: dict, set_by_imports: dict) -> None:
    data, ancillary, _, _ = conn.recvmsg(MESSAGE, socket.CMSG_SPACE(3 * 4))
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    request = json.loads(data)
    differs = _differs(request, same)
    if differs:
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"cold": differs}).encode())
        return
    sys.stdout.flush(), sys.stderr.flush()  # nothing of the server's is written twice
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        listener.close()
        _child(conn, request, list(fds), set_by_imports, server)  # never returns
    for fd in fds:
        os.close(fd)
    try:
        conn.send(json.dumps({"pid": pid, "joined": _joined(pid, request["pgid"])}).encode())
    finally:  # reaped even when the command is gone (the child then kills itself)
        _, status = os.waitpid(pid, 0)
    conn.send(json.dumps({"status": status}).encode())


def _differs(request: dict, same: dict) -> str:
    """Why the server cannot run this command as the command would ('' when it can): another
    interpreter, another import path, other code, or other load-time settings. The command's
    own folder (first on its import path) may differ from the server's: a copy of the project
    (the preloaded libraries come from the rest of the path, which must be the same). Either way
    the `envace` it would import, and the server's own, must still be byte for byte what the
    server imported: code edited since then starts cold, not half old and half new."""
    if request["executable"] != same["executable"]:
        return f"another interpreter ({request['executable']})"
    if request["path"][1:] != same["path"][1:]:
        return "another import path"
    package = _package_on(request["path"], request["cwd"])
    own = package is not None and package.resolve() == same["package"].resolve()
    if package is None or folder_digest(package) != same["code"]:
        return "its code changed since the server imported it" if own else \
            f"another copy of the code ({package or 'no envace on its import path'})"
    if not own and folder_digest(same["package"]) != same["code"]:
        return "the server's code changed since it imported it"
    env = sorted(set(_load_time_env(request["env"]).items()) ^ set(same["env"].items()))
    return f"{env[0][0]} differs from the server's" if env else ""


def _package_on(path: list[str], cwd: str) -> Path | None:
    """The `envace` folder an interpreter with this import path would import."""
    for entry in path:
        folder = Path(cwd, entry) / "envace"
        if (folder / "__init__.py").is_file():
            return folder
    return None


def _joined(pid: int, pgid: int) -> bool:
    """Whether the child is in the command's process group (it moves itself there first)."""
    for _ in range(1000):
        try:
            if os.getpgid(pid) == pgid:
                return True
        except ProcessLookupError:
            return False
        threading.Event().wait(0.001)
    return False


def _child(conn: socket.socket, request: dict, fds: list[int], set_by_imports: dict, server: int) -> None:
    """The stage, run as its command would have run it; ends the process with its status."""
    code = 1
    try:
        _die_with_parent(signal.SIGKILL)
        if os.getppid() != server:  # the server died before that took hold: its command runs the stage cold
            os._exit(1)
        try:
            os.setpgid(0, request["pgid"])
        except OSError:  # another session: the command forwards its signals instead
            pass
        threading.Thread(target=_exit_when_closed, args=(conn,), daemon=True).start()
        for fd, stream in zip(fds, request["streams"]):
            os.dup2(fd, stream)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**set_by_imports, **request["env"]})
        del os.environ[VARIABLE]  # its own children start cold
        os.sched_setaffinity(0, request["cpus"])
        envace.CORES_ALLOWED = len(request["cpus"])
        sys.argv, sys.path[:] = list(request["argv"]), request["path"]  # what it does not find imported: from its folder
        code = _run_module(request["module"])
    except BaseException:  # noqa: BLE001 - reported as Python would, then the status
        import traceback

        traceback.print_exc()
    finally:
        envace.finish(code)


def _run_module(module: str) -> int:
    """`python -m module`'s exit status: 0, SystemExit's code, or 1 after a traceback."""
    import runpy

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        return 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        return 1


def _exit_when_closed(conn: socket.socket) -> None:
    """The command died (its end of the socket closed): the stage goes with it."""
    try:
        while conn.recv(MESSAGE):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _die_with_parent(signum: int) -> None:
    """Linux: `signum` when the parent dies (even by SIGKILL)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
