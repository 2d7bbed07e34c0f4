"""validate_data — the data gate: a Great Expectations suite over the prepared files.

Writes `metrics/data.json` ({"domains", "splits", "passed", "expectations": [...]}) and a
human-readable `reports/data_validation.md` — also when the gate fails, so the failure can
be read. A failing expectation fails the stage with its name and example bad rows
(`<file>:<line>`), so nothing downstream runs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from envace.config import Params
from envace.gates import describe_failures, run_checks
from envace.gates.data_quality import SPLITS, build_tables, checks
from envace.io import write_json, write_text
from envace.paths import COLLECTED, PREPARED
from envace.stages import StageFailed

METRICS = Path("metrics/data.json")
REPORT = Path("reports/data_validation.md")


def run(params: Params) -> dict[str, Path]:
    """Validate the prepared data; fail naming the broken expectations and rows."""
    missing = [s for s in SPLITS if not (PREPARED / f"{s}.jsonl").exists()]
    if missing:
        raise StageFailed(f"missing prepared file(s): {', '.join(f'{PREPARED}/{s}.jsonl' for s in missing)}; run prepare first")
    tables = build_tables(PREPARED, params)
    results = run_checks(tables, checks(params), params.validate_data.max_examples, gate="validate_data")
    episodes = tables["episodes"]
    passed = all(r["success"] for r in results)
    summary = {
        "passed": passed,
        "domains": sorted(episodes["domain"].dropna().unique().tolist()),
        "splits": {s: int(n) for s, n in zip(tables["splits"]["where"], tables["splits"]["n"])},
        "task_types": dict(sorted(Counter(f"{d}/{t}" for d, t in zip(episodes["domain"], episodes["task_type"]) if d).items())),
        "calls": len(tables["calls"]),
        "sources": json.loads(COLLECTED.read_text()).get("sources", {}) if COLLECTED.exists() else {},
        "expectations": results,
    }
    write_json(METRICS, summary)
    write_text(REPORT, report(summary))
    if not passed:
        raise StageFailed(f"data gate failed ({REPORT}):\n{describe_failures(results)}")
    return {"metrics": METRICS, "report": REPORT}


def report(summary: dict) -> str:
    lines = [
        f"# Data validation: {'PASSED' if summary['passed'] else 'FAILED'}", "",
        f"Domains: {', '.join(summary['domains'])}  ",
        "Splits: " + ", ".join(f"{s} {n}" for s, n in summary["splits"].items()) + f"  \nRecorded calls: {summary['calls']}", "",
    ]
    if summary["sources"]:
        lines += ["Where the episodes came from:", "", "| domain | episodes | real backend | privileged facts for REHEARSE "
                  "| checklists |", "|---|---|---|---|---|"]
        for name, s in summary["sources"].items():
            how = "generated with the demonstrator's ground truth" if s.get("generated") else (
                f"{s['checklist_given']} given, {s['checklist_derived']} derived from the successful episode, "
                f"{s['dropped_unjudgeable']} failed without one left out")
            facts = {"backend": "yes, from the backend (every tool)", "scenario": "yes, what each call touches in "
                     "the logged scenario (every tool)"}.get(s["privileged_facts"], "no: REHEARSE learns from history alone")
            lines.append(f"| {name} | {s['episodes']} | {s['backend']} | {facts} | {how} |")
        lines.append("")
    lines += ["| | expectation | GE type | column | bad rows | examples |", "|---|---|---|---|---|---|"]
    for r in summary["expectations"]:
        mark = "✅" if r["success"] else "❌"
        bad = r["unexpected_count"] if r["unexpected_count"] or r["success"] else r["observed_value"]
        lines.append(f"| {mark} | {r['name']} | `{r['expectation']}` | {r['table']}.{r['column'] or '*'} | {bad} | "
                     f"{', '.join(r['examples'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from envace.stages import main

    main("validate_data", run)
