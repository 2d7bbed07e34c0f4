"""rehearsal_gate — is REHEARSE good enough for rehearsal-only RL? (Great Expectations)

Measures rehearsal accuracy of the warmed-up model on the held-out test trajectories,
teacher-forced, with and without the privileged facts, and requires every core tool to
reach `gate.min_rehearsal_accuracy` (exact match, with facts). Below it the stage fails
naming the tools that fall short and their accuracies, and nothing downstream runs.

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
    from envace.gates.rehearsal import checks, tool_table
    from envace.rollout.runner import load_policy

    cfg = params.gate
    policy = load_policy(WARMUP_MODEL, params.trainer, params.model.max_seq_len)
    test = spread(list(read_jsonl(PREPARED / "test.jsonl")), cfg.episodes)
    cap = params.rollout.max_new_tokens
    shown = rehearsal_accuracy(policy, test, privileged=True, max_new_tokens=cap)
    hidden = rehearsal_accuracy(policy, test, privileged=False, max_new_tokens=cap)
    table = tool_table(shown["per_tool"], cfg)
    results = run_checks({"tools": table}, checks(cfg), cfg.max_examples)
    passed = all(r["success"] for r in results)
    summary = {
        "overall": shown["exact"], "overall_field": shown["field"],
        "overall_without_privileged": hidden["exact"], "overall_field_without_privileged": hidden["field"],
        "per_tool": {t: r["exact"] for t, r in shown["per_tool"].items()},
        "per_tool_without_privileged": {t: r["exact"] for t, r in hidden["per_tool"].items()},
        "per_tool_detail": shown["per_tool"], "core_tools": table["tool"].tolist(), "calls": shown["n"],
        "threshold": cfg.min_rehearsal_accuracy, "passed": passed, "expectations": results,
    }
    write_json(METRICS, summary)
    write_text(REPORT, report(summary))
    if not passed:
        short = [f"{t} {a:.3f}" for t, a in summary["per_tool"].items()
                 if t in summary["core_tools"] and a < cfg.min_rehearsal_accuracy]
        raise StageFailed(f"rehearsal gate failed: tools below {cfg.min_rehearsal_accuracy}: {', '.join(short) or 'none'}"
                          f"\n{describe_failures(results)}")
    return {"metrics": METRICS, "report": REPORT}


def report(s: dict) -> str:
    lines = [
        f"# Rehearsal gate: {'PASSED' if s['passed'] else 'FAILED'}", "",
        f"Exact match on {s['calls']} held-out real responses: **{s['overall']:.3f}** with privileged facts, "
        f"{s['overall_without_privileged']:.3f} without (field-level {s['overall_field']:.3f} / "
        f"{s['overall_field_without_privileged']:.3f}). Threshold per core tool: {s['threshold']}.", "",
        "| tool | core | calls | exact (facts) | exact (no facts) | field (facts) |", "|---|---|---|---|---|---|",
    ]
    for tool, d in s["per_tool_detail"].items():
        ok = "" if tool not in s["core_tools"] else ("✅" if d["exact"] >= s["threshold"] else "❌")
        lines.append(f"| {tool} | {ok} | {d['n']} | {d['exact']:.3f} | {s['per_tool_without_privileged'][tool]:.3f} | "
                     f"{d['field']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from envace.stages import main

    main("rehearsal_gate", run)
