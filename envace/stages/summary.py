"""summary — the pipeline at a glance: `metrics/summary.json`.

A handful of headline numbers read from the stages' own metrics files, which keep the detail:
the rehearsal gate's exact match, each evaluated variant's success in the real backends, and
the real-backend calls the agent to register made in training. It is the one file dvc.yaml
declares as metrics, so `dvc metrics show` and `dvc exp show` fit on one screen; the flow logs
the same numbers on its parent MLflow run, with the registered version beside them.

It reads nothing `register` writes: a DVC experiment that stops before the registry (`make
seeds` runs each seed to `summary`) still gets its own headline in `dvc exp show`, instead of
the workspace's numbers carried over in a file no stage of it rewrote. A key whose stage has
not run (or could not measure it) is left out.
"""

from __future__ import annotations

import json
from pathlib import Path

from envace.config import Params
from envace.io import write_json

SUMMARY = Path("metrics/summary.json")

SOURCES = {"validate_data": "metrics/data.json", "rehearsal_gate": "metrics/rehearsal.json",
           "evaluate": "metrics/eval.json", "register": "metrics/register.json"}
SUMMARISED = {"validate_data", "rehearsal_gate", "evaluate"}  # what summary.json reads: not the registry


def headline(root: Path, agent: str, stages: set[str] | None = None) -> dict:
    """The headline numbers found under `root`, from every stage or only from `stages`:
    `data_ok` and `gate_ok` (the data and rehearsal gates passed), `rehearsal` (the gate's exact
    match), each evaluated variant's success by its name, `real_calls` (the real-backend calls
    the `agent` variant made in training) and the registered `version` (whether it became
    champion: `reports/register.md`)."""
    found = {stage: json.loads((root / path).read_text()) for stage, path in SOURCES.items()
             if (stages is None or stage in stages) and (root / path).exists()}
    out = {}
    if "validate_data" in found:
        out["data_ok"] = found["validate_data"]["passed"]
    if "rehearsal_gate" in found:
        out |= {"gate_ok": found["rehearsal_gate"]["passed"], "rehearsal": round(found["rehearsal_gate"]["overall"], 4)}
    evaluated = found.get("evaluate", {}).get("variants", {})
    for variant, v in evaluated.items():
        if v.get("success") is not None:  # None: no real backend to measure it
            out[variant] = round(v["success"], 4)
    if agent in evaluated:
        out["real_calls"] = evaluated[agent]["real_env_calls_train"]
    if "register" in found:
        out["version"] = int(found["register"]["version"])
    return out


def summary_of(root: Path, agent: str) -> dict:
    """What metrics/summary.json holds: the headline of the stages up to `evaluate`, less the
    gates' verdicts (both passed, or the stages after them would not have run)."""
    return {k: v for k, v in headline(root, agent, SUMMARISED).items() if k not in ("data_ok", "gate_ok")}


def run(params: Params) -> dict[str, Path]:
    """Write metrics/summary.json from the stages' metrics files."""
    summary = summary_of(Path("."), params.registry.variant)
    write_json(SUMMARY, summary)
    print("summary: " + ", ".join(f"{k} {v}" for k, v in summary.items()), flush=True)
    return {"metrics": SUMMARY}


if __name__ == "__main__":
    from envace.stages import main

    main("summary", run)
