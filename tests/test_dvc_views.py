"""What a DVC user sees of the committed results: `dvc metrics show` on one screen, and
`dvc plots show` drawn offline (headless Chromium, no network: Vega is inlined)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.browser import png_size, render

REPO = Path(__file__).resolve().parents[1]


def _dvc(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["dvc", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def test_dvc_metrics_show_is_the_summary_on_one_screen():
    from envace.config import load_params
    from envace.stages.summary import summary_of

    shown = _dvc("metrics", "show")
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip()}
    assert set(rows) >= {"Path", "metrics/summary.json"}
    assert not any(path.startswith("metrics/") and path != "metrics/summary.json" for path in rows)  # detail elsewhere
    assert len(rows["Path"]) <= 120 and len(rows["metrics/summary.json"]) <= 120, shown.stdout
    summary = json.loads((REPO / "metrics/summary.json").read_text())
    assert 0 < len(summary) <= 20 and summary == summary_of(REPO, load_params(REPO / "params.yaml").registry.variant)


def test_no_timing_in_tracked_metrics_or_plots():
    """A rerun that reproduces the same models must leave git clean: wall clock goes to timings/."""
    tracked = subprocess.run(["git", "ls-files", "metrics", "plots", "examples/*/metrics", "examples/*/plots"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    timing = re.compile(r"wall_s|seconds|tokens_per_s")
    assert tracked and not [path for path in tracked if timing.search((REPO / path).read_text())]


def test_dvc_plots_show_draws_the_validation_curve_offline(chromium, tmp_path):
    from envace.offline_plots import write_template

    write_template(REPO)  # what `make install` writes; .dvc/config points DVC at it
    shown = _dvc("plots", "show", "-o", str(tmp_path / "plots"))
    assert shown.returncode == 0, shown.stderr
    page = tmp_path / "plots" / "index.html"
    assert not re.search(r"<script[^>]*\bsrc=", page.read_text())  # every script inline: nothing to fetch
    dom = render(page.as_uri(), tmp_path / "plots.png", virtual_time_ms=10_000)
    drawn = re.findall(r"<svg.*?</svg>", dom, flags=re.S)  # vega's SVG: axes, titles and legends are text
    validation = [svg for svg in drawn if "warmup validation" in svg]
    assert validation and all(f in validation[0] for f in ("val_rehearsal_exact", "epoch")), "validation curve not drawn"
    assert any("evaluation" in svg and "envace" in svg for svg in drawn)  # the bar chart per variant
    assert png_size(tmp_path / "plots.png")[0] > 0

