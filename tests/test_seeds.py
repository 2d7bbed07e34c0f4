"""Results across seeds: the summary's arithmetic, and the real thing as DVC experiments."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_PARAMS, make_project


def _eval(success: dict[str, float], n: int = 100) -> dict:
    return {"variants": {v: {"success": s, "n": n} for v, s in success.items()}}


def test_the_summary_pools_every_seed_and_names_the_failed_ones():
    from envace.evaluate import wilson
    from envace.seeds import report, summarise

    results = {0: _eval({"envace": 0.70, "sft": 0.50}), 1: _eval({"envace": 0.60, "sft": 0.55}),
               2: _eval({"envace": 0.65, "sft": 0.40})}
    s = summarise(results, {3: "experiment seed-3 did not finish"})
    env = s["variants"]["envace"]
    assert env["seeds"] == [0.70, 0.60, 0.65] and env["min"] == 0.60 and env["max"] == 0.70
    assert env["mean"] == pytest.approx(0.65) and env["n"] == 300
    assert (env["ci_low"], env["ci_high"]) == wilson(195, 300)  # pooled: 70 + 60 + 65 of 300
    assert s["seeds"] == [0, 1, 2] and s["tasks"] == 100 and s["failed"] == {"3": "experiment seed-3 did not finish"}
    text = report(s)
    assert text.index("| envace |") < text.index("| sft |")  # best first
    assert "**seed 3 failed**" in text


@pytest.mark.slow
def test_make_seeds_runs_one_dvc_experiment_per_seed(tmp_path):
    """Two seeds of the tiny profile as real DVC experiments (a git repository), each to
    `evaluate` and `summary`; the report reads each experiment's own metrics, and `dvc exp show`
    shows each experiment's own headline (the workspace never ran: nothing to carry over). The
    experiments' copies of the project hold its code: the warm server refuses none of their stages."""
    project = make_project(tmp_path / "proj", dvc=False)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    git = lambda *a: subprocess.run(["git", *a], cwd=project, check=True, capture_output=True, env=env)  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=project, check=True, env=env)
    (project / ".gitignore").write_text("/.mlflow\n/.prefect\n__pycache__/\n")
    git("add", "-A")
    git("commit", "-qm", "tiny project")
    out = subprocess.run([sys.executable, "-m", "envace.seeds", "--seeds", "0", "1"], cwd=project, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Running stage 'warmup'" in out.stdout + out.stderr and "starts cold" not in out.stdout + out.stderr
    s = json.loads((project / "metrics/seeds.json").read_text())
    assert s["seeds"] == [0, 1] and s["failed"] == {}
    assert set(s["variants"]) == {"sft", "envace", "real_env", "simulator"}
    assert all(len(v["seeds"]) == 2 for v in s["variants"].values())
    shown = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], cwd=project, env=env,
                           capture_output=True, text=True)
    headlines = dict(_experiment_summaries(json.loads(shown.stdout)))
    assert set(headlines) == {"seed-0", "seed-1"}, shown.stdout[-2000:]
    for seed in (0, 1):
        assert {v: headlines[f"seed-{seed}"][v] for v in s["variants"]} == \
            {v: round(d["seeds"][seed], 4) for v, d in s["variants"].items()}
    assert "# Results across seeds (0, 1)" in (project / "reports/seeds.md").read_text()


def _experiment_summaries(node):
    """(name, metrics/summary.json) of every named experiment in `dvc exp show --json`."""
    if isinstance(node, dict):
        summary = ((node.get("data") or {}).get("metrics") or {}).get("metrics/summary.json", {}).get("data")
        if str(node.get("name", "")).startswith("seed-") and summary is not None:
            yield node["name"], summary
        for value in node.values():
            yield from _experiment_summaries(value)
    elif isinstance(node, list):
        for value in node:
            yield from _experiment_summaries(value)
