"""evaluate — every trained variant plays the held-out test tasks in the real backends.

For each variant of `train` (sft, real_env, simulator, envace): greedy success with its 95%
Wilson interval, per domain and per task type; turns and ACT tokens per task; the persona
leak rate; rehearsal accuracy on the test responses (with and without the privileged
facts); and the real-backend calls it made in training. One MLflow run per variant.

Writes `metrics/eval.json` ({"backend": "python" | "mcp" | "none", "available", "variants": {name:
{"success", "ci_low", "ci_high", "n", "real_env_calls_train", ...}}}) and the comparison table
`reports/eval.md` and `plots/eval.csv` (success per variant). A logs-only domain cannot be played for real: the file says so
(`"available": false` and the reason) and holds no variant.
"""

from __future__ import annotations

import json
from pathlib import Path

from envace.config import Params
from envace.data.splits import spread
from envace.io import read_jsonl, write_csv, write_json, write_text
from envace.paths import EVAL_METRICS, PREPARED, TRAIN_METRICS, TRAIN_MODELS
from envace.stages import StageFailed

METRICS = EVAL_METRICS
REPORT = Path("reports/eval.md")
PLOT = Path("plots/eval.csv")  # success per variant, a bar chart in `dvc plots show`
PLOT_FIELDS = ["variant", "success", "ci_low", "ci_high"]


def run(params: Params) -> dict[str, Path]:
    """Evaluate every trained variant on the held-out test tasks in the real backends."""
    import torch

    from envace.domains.base import Task
    from envace.evaluate.real import backend_kind, unavailable
    from envace.model import cpu_threads
    from envace.roles import leak_words_of
    from envace.train import VARIANTS

    torch.set_num_threads(cpu_threads())
    missing = [v for v in VARIANTS if not any((TRAIN_MODELS / v / f).exists() for f in ("config.json", "adapter_config.json"))]
    if missing:
        raise StageFailed(f"no trained model for variant(s) {', '.join(missing)} under {TRAIN_MODELS}: "
                          f"run `python -m envace.stages.train --variant <name>` (or `dvc repro train`) first")
    test = spread(list(read_jsonl(PREPARED / "test.jsonl")), params.evaluate.tasks)
    tasks = [Task.from_dict(e["task"]) for e in test]
    why_not = unavailable(tasks)
    if why_not:  # logs only: say so, never fake a real evaluation
        summary = {"backend": "none", "available": False, "reason": why_not, "variants": {}, "n_tasks": 0}
        write_json(METRICS, summary)
        write_csv(PLOT, [], PLOT_FIELDS)
        write_text(REPORT, f"# Evaluation\n\nReal-environment evaluation was not possible: {why_not}.\n")
        print(f"evaluate: not possible: {why_not}", flush=True)
        return {"metrics": METRICS, "report": REPORT}
    train = list(read_jsonl(PREPARED / "train.jsonl"))
    leak = frozenset(leak_words_of(train))
    unseen = unseen_value_episodes(test, train)
    results = {}
    for variant in VARIANTS:
        results[variant] = evaluate_variant(variant, params, test, tasks, leak, unseen)
        r = results[variant]
        print(f"evaluate[{variant}]: success {r['success']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] on {r['n']} "
              f"tasks; real-backend calls in training {r['real_env_calls_train']}", flush=True)
    summary = {"backend": backend_kind(tasks), "available": True, "variants": results, "n_tasks": len(tasks)}
    write_json(METRICS, summary)
    write_csv(PLOT, [{"variant": name, **{k: r[k] for k in PLOT_FIELDS[1:]}} for name, r in results.items()], PLOT_FIELDS)
    write_text(REPORT, report(summary))
    _log_runs(summary, params)
    return {"metrics": METRICS, "report": REPORT}


def unseen_value_episodes(test: list[dict], train: list[dict]) -> list[dict]:
    """Test episodes that call a tool with a value (an id, a name, any text) that occurs nowhere in
    the training split — in no call, response or scenario: it can only be copied, never recalled."""
    from envace.data.logs import scalars

    seen = {v for ep in train for v in scalars([ep["messages"], ep["task"]["scenario"]])}
    return [ep for ep in test if any(v not in seen for m in ep["messages"] for c in m.get("calls", [])
                                     for v in scalars(c["arguments"]))]


def evaluate_variant(variant: str, params: Params, test: list[dict], tasks: list, leak: frozenset[str],
                     unseen: list[dict]) -> dict:
    from envace.evaluate.real import real_success
    from envace.evaluate.rehearsal import rehearsal_accuracy
    from envace.rollout.runner import load_policy

    policy = load_policy(TRAIN_MODELS / variant, params.trainer, params.model.max_seq_len)
    out = real_success(policy, tasks, params.rollout, leak_words=leak, subset={e["task"]["id"] for e in unseen})
    if unseen:  # copying what training never showed: ACT's success and REHEARSE's exact match
        new = out.pop("subset")
        exact = rehearsal_accuracy(policy, unseen, privileged=True, max_new_tokens=params.rollout.max_new_tokens)
        out["unseen_values"] = {"n": new["n"], "success": new["success"], "ci_low": new["ci_low"],
                                "ci_high": new["ci_high"], "rehearsal_exact": exact["exact"]}
    trained = json.loads((TRAIN_METRICS / f"{variant}.json").read_text())
    out["real_env_calls_train"] = trained["real_env_calls_train"]
    out["train_steps"] = trained["steps"]
    if params.evaluate.rehearsal:
        cap = params.rollout.max_new_tokens
        out["rehearsal_exact"] = rehearsal_accuracy(policy, test, privileged=True, max_new_tokens=cap)["exact"]
        out["rehearsal_exact_without_privileged"] = rehearsal_accuracy(policy, test, privileged=False,
                                                                       max_new_tokens=cap)["exact"]
    return out


def report(summary: dict) -> str:
    variants = summary["variants"]
    lines = [
        f"# Evaluation: {summary['n_tasks']} held-out tasks in the real backends ({summary['backend']})", "",
        "| variant | success | 95% CI | real calls in training | turns/task | ACT tokens/task | leak rate "
        "| rehearsal exact (facts / none) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in variants.items():
        rehearsal = (f"{r['rehearsal_exact']:.3f} / {r['rehearsal_exact_without_privileged']:.3f}"
                     if "rehearsal_exact" in r else "-")
        lines.append(f"| {name} | {r['success']:.3f} | [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | "
                     f"{r['real_env_calls_train']} | {r['turns_per_task']} | {r['act_tokens_per_task']} | "
                     f"{r['leak_rate']:.3f} | {rehearsal} |")
    unseen = {name: r["unseen_values"] for name, r in variants.items() if "unseen_values" in r}
    if unseen:
        n = next(iter(unseen.values()))["n"]
        lines += ["", f"Test episodes calling with a value that occurs nowhere in training (n = {n}): ACT success "
                  "[95% CI] and rehearsal exact match:", "", "| variant | success | 95% CI | rehearsal exact |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {u['success']:.3f} | [{u['ci_low']:.3f}, {u['ci_high']:.3f}] | {u['rehearsal_exact']:.3f} |"
                  for name, u in unseen.items()]
    types = sorted({t for r in variants.values() for t in r["per_task_type"]})
    lines += ["", "Success per task type:", "", "| task type | " + " | ".join(variants) + " |",
              "|---|" + "---|" * len(variants)]
    lines += [f"| {t} | " + " | ".join(f"{r['per_task_type'].get(t, 0):.2f}" for r in variants.values()) + " |"
              for t in types]
    return "\n".join(lines) + "\n"


def _log_runs(summary: dict, params: Params) -> None:
    """One top-level run per variant: its headline numbers as metrics (the runs table's columns),
    the breakdowns (per domain, per task type, failed steps) as MLflow tables, the report."""
    import mlflow
    import pandas as pd

    from envace.tracking import flatten, log_to_run, variant_run

    for name, r in summary["variants"].items():
        with variant_run(f"eval-{name}", {"variant": name, "stage": "evaluate"}):
            log_to_run({"variant": name, **flatten(params.train.model_dump(), "train.")},
                       {k: float(v) for k, v in r.items() if isinstance(v, (int, float))}, {}, [REPORT])
            for breakdown, column, value in (("per_domain", "domain", "success"), ("per_task_type", "task_type", "success"),
                                             ("failed_steps", "step", "episodes")):
                if r.get(breakdown):
                    mlflow.log_table(pd.DataFrame({column: list(r[breakdown]), value: list(r[breakdown].values())}),
                                     f"{breakdown}.json")


if __name__ == "__main__":
    from envace.stages import main

    main("evaluate", run)
