"""summary — the pipeline at a glance: `metrics/summary.json`.

A handful of headline numbers read from the stages' own metrics files, which keep the detail:
the rehearsal gate's exact match, each evaluated variant's success in the real backends, and
the registered version. It is the one file dvc.yaml declares as metrics, so
`dvc metrics show` and `dvc exp show` fit on one screen; the flow logs the same numbers on its
parent MLflow run. A key whose stage has not run (or could not measure it) is left out.
"""

from __future__ import annotations

import json
from pathlib import Path

from envace.config import Params
from envace.io import write_json

SUMMARY = Path("metrics/summary.json")

SOURCES = {"validate_data": "metrics/data.json", "rehearsal_gate": "metrics/rehearsal.json",
           "evaluate": "metrics/eval.json", "register": "metrics/register.json"}


def headline(root: Path, stages: set[str] | None = None) -> dict:
    """The headline numbers found under `root`, from every stage or only from `stages`:
    `data_ok` and `gate_ok` (the data and rehearsal gates passed), `rehearsal` (the gate's exact
    match), each evaluated variant's success by its name, and the registered model's
    `real_calls` (in training) and `version` (whether it became champion: `reports/register.md`)."""
    found = {stage: json.loads((root / path).read_text()) for stage, path in SOURCES.items()
             if (stages is None or stage in stages) and (root / path).exists()}
    out = {}
    if "validate_data" in found:
        out["data_ok"] = found["validate_data"]["passed"]
    if "rehearsal_gate" in found:
        out |= {"gate_ok": found["rehearsal_gate"]["passed"], "rehearsal": round(found["rehearsal_gate"]["overall"], 4)}
    for variant, v in found.get("evaluate", {}).get("variants", {}).items():
        if v.get("success") is not None:  # None: no real backend to measure it
            out[variant] = round(v["success"], 4)
    if "register" in found:
        r = found["register"]
        out |= {"real_calls": r["real_calls"], "version": int(r["version"])}
    return out


def run(params: Params) -> dict[str, Path]:
    """Write metrics/summary.json from the stages' metrics files."""
    # both gates passed, or the stages this one depends on would not have run: not worth a column
    summary = {k: v for k, v in headline(Path(".")).items() if k not in ("data_ok", "gate_ok")}
    write_json(SUMMARY, summary)
    print("summary: " + ", ".join(f"{k} {v}" for k, v in summary.items()), flush=True)
    return {"metrics": SUMMARY}


if __name__ == "__main__":
    from envace.stages import main

    main("summary", run)
