"""Headless Chromium for UI checks: render a page (screenshot + DOM after its JavaScript
ran) and check the MLflow UI of a tracking server.

Chromium is Debian's `chromium` package (headless, no driver needed); the Makefile's
`test` target installs it when missing. Rendering uses Chromium's own command line: one
invocation with `--virtual-time-budget` (virtual time pauses while network fetches are
pending, so the single-page app gets its API answers and renders before the budget runs
out, however slow the server), `--screenshot` and `--dump-dom`. No driver, no DevTools
client. The MLflow UI loads asynchronously, so `check_mlflow_ui` re-renders with a larger
budget until the expected text shows up (no sleeps).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

WINDOW = (1400, 1000)
# Headless in a container (no sandbox, no GPU, no background traffic), a fixed window and no
# scrollbars for stable screenshots;
# --disable-dev-shm-usage: containers often have a tiny /dev/shm.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
    "--run-all-compositor-stages-before-draw",
]
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MIN_PNG_BYTES = 10_000


def chromium_binary() -> str | None:
    """Path of a Chromium executable: $CHROMIUM if set, else the first one on PATH."""
    override = os.environ.get("CHROMIUM")
    if override:
        return shutil.which(override)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def install_chromium(timeout_s: float = 600) -> str | None:
    """Install Debian's chromium with apt-get when missing and we may (root, apt-get there).
    Returns the binary, or None when it is not there and cannot be installed."""
    found = chromium_binary()
    if found or os.environ.get("CHROMIUM") or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, timeout=timeout_s,
                       capture_output=True, check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env,
                       timeout=timeout_s, capture_output=True, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return chromium_binary()


def render(url: str, screenshot: Path, timeout_s: float = 60, virtual_time_ms: int = 20_000) -> str:
    """Load `url` in headless Chromium with a fresh profile, let its JavaScript run for up to
    `virtual_time_ms` of virtual time, save a PNG of the window to `screenshot` and return
    the serialized DOM (HTML) as it stands then. `visible_text` turns it into page text."""
    binary = chromium_binary()
    if binary is None:
        raise RuntimeError("chromium not found (apt-get install -y chromium)")
    screenshot = Path(screenshot).resolve()
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    screenshot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="envace-chromium-") as profile:
        cmd = [
            binary, *FLAGS,
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={int(virtual_time_ms)}",
            f"--screenshot={screenshot}",
            "--dump-dom",
            url,
        ]
        # own process group: on a timeout the whole browser (zygote, renderers) goes
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise TimeoutError(f"chromium did not finish {url} within {timeout_s} s") from None
        finally:
            _kill_group(proc)  # stray children, if any
    if proc.returncode != 0 or not screenshot.is_file():
        tail = err.decode(errors="replace")[-2000:]
        raise RuntimeError(f"chromium failed on {url} (rc={proc.returncode}):\n{tail}")
    return out.decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class _Text(HTMLParser):
    SKIP = {"script", "style", "svg", "noscript", "template", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def visible_text(dom: str) -> str:
    """The text a reader sees: tags, scripts, styles and <head> dropped, whitespace folded."""
    parser = _Text()
    parser.feed(dom)
    parser.close()
    return " ".join(" ".join(parser.parts).split())


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG; raises ValueError when the file is not one."""
    head = Path(path).read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def render_until(url: str, screenshot: Path, expected: list[str], deadline_s: float = 90,
                 budgets_ms: tuple[int, ...] = (15_000, 30_000, 60_000, 120_000)) -> str:
    """Render `url` until every string in `expected` is in the page text, with a growing
    virtual-time budget, within `deadline_s` of wall time. Returns the last page text
    (the caller asserts; the last DOM is written next to the screenshot)."""
    start = time.monotonic()
    text = ""
    for i, budget in enumerate(budgets_ms):
        left = deadline_s - (time.monotonic() - start)
        if left <= 5 and i:
            break
        dom = render(url, screenshot, timeout_s=max(left, 30), virtual_time_ms=budget)
        Path(screenshot).with_suffix(".html").write_text(dom)
        text = visible_text(dom)
        if all(s in text for s in expected):
            break
    return text


def _experiment_id(base_url: str, name: str) -> str:
    query = urllib.parse.urlencode({"experiment_name": name})
    url = f"{base_url}/api/2.0/mlflow/experiments/get-by-name?{query}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.load(resp)["experiment"]["experiment_id"]


def _run_id(base_url: str, experiment_id: str, run_name: str) -> str:
    body = json.dumps({"experiment_ids": [experiment_id], "filter": f"attributes.run_name = '{run_name}'",
                       "max_results": 1}).encode()
    request = urllib.request.Request(f"{base_url}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        (run,) = json.load(resp)["runs"]
    return run["info"]["run_id"]


def check_mlflow_ui(base_url: str, experiment_name: str, run_names: list[str], model_name: str,
                    alias: str, out_dir: Path, deadline_s: float = 90,
                    trace: tuple[str, list[str]] | None = None, runs_query: str = "",
                    compare: tuple[list[str], list[str]] | None = None, version: str | None = None) -> dict:
    """Render an MLflow 3 tracking server's UI and check what it shows:
    - the experiment's runs page (`#/experiments/<id>/runs`, plus `runs_query`) lists every run in
      `run_names` (and any column name passed there);
    - the registered model's page (`#/models/<name>`) shows the model name and `alias`;
    - with `compare` (run names, metric names), the compare view of those runs shows each of them
      and each metric;
    - with `version`, that version's page shows a signature (a non-empty output schema);
    - with `trace` (trace id, span names), the trace view (`#/experiments/<id>/traces/<trace id>`)
      shows those spans;
    - the screenshots are real PNGs of the window size, over 10 kB.
    Screenshots (and the DOMs, as .html) go to `out_dir`. Raises AssertionError naming what
    is missing; returns the URLs, screenshot paths and page texts."""
    base_url = base_url.rstrip("/")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    exp_id = _experiment_id(base_url, experiment_name)
    pages = {
        "experiment": (f"{base_url}/#/experiments/{exp_id}/runs{runs_query}", [experiment_name, *run_names]),
        "model": (f"{base_url}/#/models/{urllib.parse.quote(model_name, safe='')}", [model_name, alias]),
    }
    if trace is not None:
        pages["trace"] = (f"{base_url}/#/experiments/{exp_id}/traces/{trace[0]}", trace[1])
    if compare is not None:
        names, metrics = compare
        ids = [_run_id(base_url, exp_id, name) for name in names]
        query = urllib.parse.urlencode({"runs": json.dumps(ids), "experiments": json.dumps([exp_id])})
        pages["compare"] = (f"{base_url}/#/compare-runs?{query}", [f"Comparing {len(ids)} Runs", *names, *metrics])
    if version is not None:
        model = urllib.parse.quote(model_name, safe="")
        pages["version"] = (f"{base_url}/#/models/{model}/versions/{version}", [f"Version {version}", "Schema", "Outputs ("])
    result: dict = {"experiment_id": exp_id}
    problems = []
    for page, (url, expected) in pages.items():
        shot = out_dir / f"mlflow-{page}.png"
        text = render_until(url, shot, expected, deadline_s=deadline_s)
        result[f"{page}_url"], result[f"{page}_screenshot"], result[f"{page}_text"] = url, shot, text
        missing = [s for s in expected if s not in text]
        if page == "version" and "Outputs (0)" in text:
            missing.append("a signature (the output schema is empty)")
        if missing:
            problems.append(f"{page} page {url} lacks {missing}; it shows: {text[:1500]!r}")
        size = shot.stat().st_size
        if size <= MIN_PNG_BYTES:
            problems.append(f"{page} screenshot {shot} is only {size} bytes")
        if png_size(shot) != WINDOW:
            problems.append(f"{page} screenshot {shot} is {png_size(shot)}, not {WINDOW}")
    if problems:
        raise AssertionError("MLflow UI check failed:\n" + "\n".join(problems))
    return result


def check_prefect_task_logs(api_url: str, artifact_key: str, expected: list[str], out_dir: Path,
                            deadline_s: float = 90) -> str:
    """Render, in the Prefect UI served beside `api_url`, the task run that made the artifact
    `artifact_key` (its latest), and check that its log lines show every string in `expected`.
    Returns the page text; the screenshot goes to `out_dir`."""
    body = json.dumps({"artifacts": {"key": {"any_": [artifact_key]}}, "sort": "CREATED_DESC", "limit": 1}).encode()
    request = urllib.request.Request(f"{api_url.rstrip('/')}/artifacts/filter", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        (artifact,) = json.load(resp)
    url = f"{api_url.rstrip('/').removesuffix('/api')}/runs/task-run/{artifact['task_run_id']}"
    shot = Path(out_dir) / f"prefect-task-run-{artifact_key}.png"
    text = render_until(url, shot, expected, deadline_s=deadline_s)
    missing = [s for s in expected if s not in text]
    assert not missing, f"Prefect task run page {url} lacks {missing}; it shows: {text[:1500]!r}"
    assert shot.stat().st_size > MIN_PNG_BYTES and png_size(shot) == WINDOW, shot
    return text
