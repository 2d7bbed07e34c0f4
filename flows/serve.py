"""`make serve` / `envace serve`: the pipeline as a service, on loopback by default.

Starts a Prefect server and an MLflow tracking server (sqlite and artifacts inside the
project: `.prefect/`, `.mlflow/`), then serves the `envace` flow as the deployment
`envace/full-pipeline` with the cron schedule of params.yaml (`serve.cron`). Each part runs
as a child process; Ctrl-C or SIGTERM stops every one of them, and so does one of them
dying. With it running, `prefect deployment run envace/full-pipeline` runs the pipeline.

Ports: PREFECT_PORT (4200) and MLFLOW_PORT (5000); host ENVACE_HOST (127.0.0.1). One part
alone (`--only prefect|mlflow|worker`, what docker/compose.yaml runs per container): the
worker then finds the servers through PREFECT_API_URL and MLFLOW_TRACKING_URI.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CODE_ROOT = Path(__file__).resolve().parents[1]  # where `flows/` lives: the deployment's entrypoint
DEPLOYMENT = "full-pipeline"
PARTS = ("prefect", "mlflow", "worker")


class ServeError(RuntimeError):
    pass


def settings() -> dict[str, str]:
    host = os.environ.get("ENVACE_HOST", "127.0.0.1")
    prefect_port, mlflow_port = os.environ.get("PREFECT_PORT", "4200"), os.environ.get("MLFLOW_PORT", "5000")
    tracking = os.environ.get("MLFLOW_TRACKING_URI", "")  # a server's URL wins; a local store does not
    local = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # where clients on this machine reach them
    return {
        "host": host, "prefect_port": prefect_port, "mlflow_port": mlflow_port,
        "prefect_api": os.environ.get("PREFECT_API_URL", f"http://{local}:{prefect_port}/api"),
        "mlflow_uri": tracking if tracking.startswith("http") else f"http://{local}:{mlflow_port}",
    }


def commands(root: Path, s: dict[str, str]) -> dict[str, list[str]]:
    from envace.tracking import artifact_location, local_store

    bin_dir = Path(sys.executable).parent
    mlflow = [str(bin_dir / "mlflow"), "server", "--backend-store-uri", local_store(root),
              "--default-artifact-root", artifact_location(root), "--host", s["host"],
              "--port", s["mlflow_port"], "--workers", "1"]
    if os.environ.get("ENVACE_MLFLOW_ALLOWED_HOSTS"):  # e.g. the compose service name
        mlflow += ["--allowed-hosts", os.environ["ENVACE_MLFLOW_ALLOWED_HOSTS"]]
    return {
        "prefect": [str(bin_dir / "prefect"), "server", "start", "--host", s["host"], "--port", s["prefect_port"],
                    "--analytics-off"],
        "mlflow": mlflow,
        "worker": [sys.executable, "-m", "envace.cli", "serve", "--only", "worker", "--project-dir", str(root)],
    }


HEALTH = {"prefect": "{prefect_api}/health", "mlflow": "{mlflow_uri}/health"}


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServeError(f"exited with code {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise ServeError(f"{url} did not answer within {timeout:.0f}s")


def serve(root: Path, only: str | None = None) -> int:
    """Run the service (all parts, or `only` one) until Ctrl-C / SIGTERM; 0 on a clean stop."""
    from envace.config import load_params

    root = root.resolve()
    cron = load_params(root / "params.yaml").serve.cron  # fails fast on a bad params.yaml
    s = settings()
    for state in (".mlflow", ".prefect"):
        (root / state).mkdir(exist_ok=True)
    if only in (None, "mlflow"):
        from envace.tracking import create_local_store

        create_local_store(root)  # complete before the server opens it, even if stopped meanwhile
    if only == "worker":
        return serve_deployment(root, cron, s)
    env = {**os.environ, "PREFECT_API_URL": s["prefect_api"], "MLFLOW_TRACKING_URI": s["mlflow_uri"]}
    children: dict[str, subprocess.Popen] = {}

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        for part, cmd in commands(root, s).items():
            if only not in (None, part):
                continue
            # all parts together: the servers' chatter goes to a log file, the worker's runs to the terminal
            log = open(root / ".prefect" / f"serve-{part}.log", "ab") if part != "worker" and only is None else None
            children[part] = subprocess.Popen(cmd, cwd=CODE_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT if log else None,
                                              start_new_session=True, preexec_fn=_die_with_parent)
        # the parts start at once, each on its own (the worker waits for both servers itself): on a
        # fresh project the Prefect server's database migrations alone take ~10 s
        for part, proc in children.items():
            if part in HEALTH:
                url = HEALTH[part].format(**s)
                try:
                    wait_healthy(url, proc)
                except ServeError as err:
                    raise ServeError(f"{part}: {err}") from None
                print(f"envace serve: {part} ready at {url.rsplit('/', 1)[0]}", flush=True)
        print(f"envace serve: Prefect UI {s['prefect_api'][:-4]} · MLflow UI {s['mlflow_uri']} · deployment "
              f"envace/{DEPLOYMENT} (cron '{cron}') — Ctrl-C stops everything", flush=True)
        while True:
            for part, proc in children.items():
                if proc.poll() is not None:
                    raise ServeError(f"{part} exited with code {proc.returncode}")
            time.sleep(1)
    except KeyboardInterrupt:
        print("envace serve: stopping", flush=True)
        return 0
    except ServeError as err:
        print(f"envace serve: {err}; stopping everything", file=sys.stderr, flush=True)
        return 1
    finally:
        for proc in reversed(list(children.values())):
            terminate(proc)


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when `envace serve` dies, even by SIGKILL (no orphaned servers)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def terminate(proc: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM the child's whole process group, SIGKILL what is left after `grace` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


class TemporaryPrefectServer:
    """Prefect's temporary server, as Prefect itself starts one when no PREFECT_API_URL names a
    server (its API without the UI, on a free port of 127.0.0.1, the project's `.prefect`
    database) — but started by `envace run` before it imports Prefect, so that the server's
    own start-up (importing the server, checking the database: seconds) runs beside the flow's
    imports instead of after them. It dies with `envace run`, even by SIGKILL."""

    def __init__(self):
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        self.log = Path(os.environ.get("PREFECT_HOME", ".prefect")) / "temporary-server.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", "--host",
                 "127.0.0.1", "--port", str(self.port), "--log-level", "error", "--lifespan", "on"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        # registered before Prefect's own exit handlers, so it runs after them (last in, first out):
        # the flow's last log lines reach the server before it stops
        atexit.register(self.stop)
        # what this process's Prefect talks to (set before Prefect is imported); run links point to
        # `make serve-prefect`'s UI, which shows the same database once this server is gone
        os.environ["PREFECT_API_URL"] = self.api_url
        os.environ.setdefault("PREFECT_UI_URL", f"http://127.0.0.1:{os.environ.get('PREFECT_PORT', '4200')}")

    def wait(self, timeout: float = 90) -> None:
        try:
            wait_healthy(f"{self.api_url}/health", self.proc, timeout)
        except ServeError as err:
            self.stop()
            raise ServeError(f"the temporary Prefect server on port {self.port} did not start ({err}): "
                             f"{_last_error(self.log)} (its whole output: {self.log})") from None

    def stop(self) -> None:
        terminate(self.proc, grace=10)


def _last_error(log: Path) -> str:
    """The exception a server's output ends in (`sqlalchemy.exc.OperationalError: ...`), else its last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[\w.]+(?:Error|Exception): ", line)]
    return (errors or lines or ["(no output)"])[-1]


def free_port() -> int:
    """A port of 127.0.0.1 that is free now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_deployment(root: Path, cron: str, s: dict[str, str]) -> int:
    """Serve the flow as deployment `envace/full-pipeline` (blocks; runs execute here)."""
    os.environ["PREFECT_API_URL"], os.environ["MLFLOW_TRACKING_URI"] = s["prefect_api"], s["mlflow_uri"]
    os.environ.setdefault("PREFECT_RUNNER_POLL_FREQUENCY", "2")
    wait_healthy(f"{s['prefect_api']}/health", None)
    wait_healthy(f"{s['mlflow_uri']}/health", None)
    os.chdir(CODE_ROOT)  # the deployment's entrypoint, flows/full_pipeline.py, is found from here
    from flows.full_pipeline import envace_flow

    envace_flow.serve(name=DEPLOYMENT, cron=cron, parameters={"project_dir": str(root)}, print_starting_message=False,
                      description="The envace pipeline: every DVC stage; DVC reruns only what is stale.")
    return 0
