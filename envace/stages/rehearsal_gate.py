"""rehearsal_gate — is REHEARSE good enough for rehearsal-only RL? (Great Expectations)

Measures rehearsal accuracy of the warmed-up model on the held-out test trajectories,
teacher-forced, with and without the privileged facts, and requires every tool the agent can
call (but those in `gate.exempt_tools`) to have `gate.min_tool_examples` held-out calls and
reach `gate.min_rehearsal_accuracy` (exact match, with facts). Otherwise the stage fails
naming each tool that falls short and why, and nothing downstream runs.

Writes `metrics/rehearsal.json` ({"overall", "overall_without_privileged", "per_tool",
"threshold", "passed", ...}) and `reports/rehearsal_gate.md`.
"""

from __future__ import annotations

from pathlib import Path

from envace.config import Params
from envace.data.splits import spread
from envace.gates import describe_failures, run_checks
from envace.io import read_jsonl, write_json, write_text
from envace.paths import PREPARED, WARMUP_MODEL
from envace.stages import StageFailed

METRICS = Path("metrics/rehearsal.json")
REPORT = Path("reports/rehearsal_gate.md")


def run(params: Params) -> dict[str, Path]:
    """Measure rehearsal accuracy on held-out real responses and apply the gate."""
    from envace.evaluate.rehearsal import rehearsal_accuracy
    from envace.gates.rehearsal import checks, offered_tools, tool_table, verdict
    from envace.rollout.runner import load_policy

    cfg = params.gate
    policy = load_policy(WARMUP_MODEL, params.trainer, params.model.max_seq_len)
    test = spread(list(read_jsonl(PREPARED / "test.jsonl")), cfg.episodes)
    offered = offered_tools(test)
    unknown = sorted(set(cfg.exempt_tools) - offered)
    if unknown:
        raise StageFailed(f"gate.exempt_tools names {', '.join(unknown)}: not a tool of the configured domains "
                          f"({', '.join(sorted(offered))})")
    cap = params.rollout.max_new_tokens
    shown = rehearsal_accuracy(policy, test, privileged=True, max_new_tokens=cap)
    hidden = rehearsal_accuracy(policy, test, privileged=False, max_new_tokens=cap)
    table = tool_table(shown["per_tool"], offered, cfg)
    results = run_checks({"tools": table}, checks(cfg), cfg.max_examples, gate="rehearsal_gate")
    passed = all(r["success"] for r in results)
    detail = {t: shown["per_tool"].get(t, {"exact": 0.0, "field": 0.0, "n": 0}) for t in sorted(offered | set(shown["per_tool"]))}
    summary = {
        "overall": shown["exact"], "overall_field": shown["field"],
        "overall_without_privileged": hidden["exact"], "overall_field_without_privileged": hidden["field"],
        "per_tool": {t: r["exact"] for t, r in detail.items()},
        "per_tool_without_privileged": {t: hidden["per_tool"].get(t, {"exact": 0.0})["exact"] for t in detail},
        "per_tool_detail": detail, "core_tools": table["tool"].tolist(),
        "verdicts": {t: verdict(t, r["exact"], r["n"], cfg) for t, r in detail.items()}, "calls": shown["n"],
        "threshold": cfg.min_rehearsal_accuracy, "min_tool_examples": cfg.min_tool_examples, "passed": passed,
        "expectations": results,
    }
    write_json(METRICS, summary)
    write_text(REPORT, report(summary))
    if not passed:
        short = [f"{t} ({v.removeprefix('failed: ')})" for t, v in summary["verdicts"].items() if v.startswith("failed")]
        raise StageFailed(f"rehearsal gate failed: {', '.join(short) or 'no tool to gate'}"
                          f"\n{describe_failures(results)}")
    return {"metrics": METRICS, "report": REPORT}


def report(s: dict) -> str:
    lines = [
        f"# Rehearsal gate: {'PASSED' if s['passed'] else 'FAILED'}", "",
        f"Exact match on {s['calls']} held-out real responses: **{s['overall']:.3f}** with privileged facts, "
        f"{s['overall_without_privileged']:.3f} without (field-level {s['overall_field']:.3f} / "
        f"{s['overall_field_without_privileged']:.3f}).",
        f"Every tool the agent can call needs {s['min_tool_examples']} held-out calls and {s['threshold']} exact match.", "",
        "| tool | verdict | calls | exact (facts) | exact (no facts) | field (facts) |", "|---|---|---|---|---|---|",
    ]
    for tool, d in s["per_tool_detail"].items():
        lines.append(f"| {tool} | {s['verdicts'][tool]} | {d['n']} | {d['exact']:.3f} | "
                     f"{s['per_tool_without_privileged'][tool]:.3f} | {d['field']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from envace.stages import main

    main("rehearsal_gate", run)
