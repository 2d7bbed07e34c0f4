"""rehearse — the test-time half: private rehearsal budgets and the guard, in the real backends.

For each model of `rehearse.models` (`sft`: never trained to rehearse; `envace`: trained
with rehearsal memories) on a fixed spread of `rehearse.tasks` test tasks (their ids are
listed in the report):
- the budget curve: greedy success after N ∈ `rehearse.budgets` private rehearsals in each
  mode, the paired gain against N = 0 with its 95% interval, tokens generated and real
  calls per task; the real calls made while rehearsing (0, counted);
- the guard: recall on harmful high-risk calls and false holds on safe ones, in informed
  and uninformed real histories from the whole test split, per tool; and end to end at
  N = 0, success and harmful real actions executed with the guard off and on.

Writes `metrics/rehearse.json`, `reports/rehearse.md`, the budget curve `plots/rehearse_budget.csv`
(a DVC plot; its PNG and the report go to the MLflow run `rehearse`, with a few episodes as
MLflow traces: private rehearsals, ACT, real tool calls and guard decisions).
"""

from __future__ import annotations

import os
from pathlib import Path

from envace.config import Params
from envace.data.splits import spread
from envace.io import read_jsonl, write_csv, write_json, write_text
from envace.paths import PREPARED, TRAIN_MODELS
from envace.stages import StageFailed

METRICS = Path("metrics/rehearse.json")
REPORT = Path("reports/rehearse.md")
PLOT = Path("plots/rehearse_budget.csv")
PNG = Path("plots/rehearse_budget.png")
TRACED = 3  # episodes per model logged as MLflow traces


def run(params: Params) -> dict[str, Path]:
    """Measure private rehearsal budgets and the guard for each model in the real backends."""
    import torch

    from envace.domains.base import Task
    from envace.evaluate.test_time import budget_curve, guard_contexts, guard_end_to_end, guard_table
    from envace.evaluate.real import unavailable
    from envace.model import cpu_threads
    from envace.rollout.runner import load_policy

    cfg = params.rehearse
    torch.set_num_threads(cpu_threads())
    missing = [m for m in cfg.models if not any((TRAIN_MODELS / m / f).exists() for f in ("config.json", "adapter_config.json"))]
    if missing:
        raise StageFailed(f"no trained model for {', '.join(missing)} under {TRAIN_MODELS}: run the train stage first")
    episodes = list(read_jsonl(PREPARED / "test.jsonl"))
    test = [Task.from_dict(e["task"]) for e in episodes]
    tasks = spread(test, cfg.tasks)
    why_not = unavailable(test)
    if why_not:
        raise StageFailed(f"test-time rehearsal is measured in the real backends, and {why_not}")
    logged = {t.id: [m["calls"] for m in e["messages"] if "calls" in m]  # for domains without a demonstrator
              for t, e in zip(test, episodes)}
    contexts = guard_contexts(test, logged)
    summary: dict = {"private_real_calls": 0, "tasks": [t.id for t in tasks], "curve": {}, "guard": {}}
    traced = {}
    for name in cfg.models:
        policy = load_policy(TRAIN_MODELS / name, params.trainer, params.model.max_seq_len)
        say = lambda mode, n, p, name=name: print(  # noqa: E731
            f"rehearse[{name}] {mode:<10} N={n}: success {p['success']:.3f} gain {p['gain']:+.3f} "
            f"[{p['gain_ci_low']:+.3f}, {p['gain_ci_high']:+.3f}] tokens/task {p['tokens_per_task']}", flush=True)
        curve, private, played = budget_curve(policy, tasks, params.rollout, cfg.budgets, cfg.modes,
                                              params.roles.memory_episodes, cfg.temperature, cfg.seed, say)
        summary["private_real_calls"] += private
        summary["curve"][name] = curve
        guard = guard_table(policy, contexts, params.rollout.max_new_tokens)
        e2e = guard_end_to_end(policy, tasks, params.rollout, params.guard.on_hold, played[cfg.modes[0]][0])
        summary["guard"][name] = {**guard, **e2e}
        print(f"rehearse[{name}] guard informed: recall {guard['informed']['recall']} false holds "
              f"{guard['informed']['false_hold']}; harmful real actions {e2e['harmful_executed_off']} off -> "
              f"{e2e['harmful_executed_on']} on", flush=True)
        traced[name] = (policy, tasks[:TRACED])
    if summary["private_real_calls"]:
        raise StageFailed(f"private rehearsal made {summary['private_real_calls']} real calls: it must make none")
    write_json(METRICS, summary)
    write_csv(PLOT, curve_rows(summary["curve"]))
    write_text(REPORT, report(summary, params))
    _log_run(summary, params, traced)
    return {"metrics": METRICS, "report": REPORT}


def curve_rows(curves: dict) -> list[dict]:
    """One row per budget, one success column per model and mode (`envace_parallel`)."""
    budgets = sorted({int(n) for modes in curves.values() for points in modes.values() for n in points})
    return [{"budget": n, **{f"{name}_{mode}": points[str(n)]["success"]
                             for name, modes in curves.items() for mode, points in modes.items()}} for n in budgets]


def _fmt(rate, ci) -> str:
    return "-" if rate is None else f"{rate:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def report(summary: dict, params: Params) -> str:
    cfg = params.rehearse
    lines = [
        f"# Test-time rehearsal and the guard: {len(summary['tasks'])} test tasks in the real backends", "",
        f"Real calls while rehearsing privately: **{summary['private_real_calls']}**. Imagined episodes sample at "
        f"temperature {cfg.temperature}; the real episode is greedy and reads a memory of at most "
        f"{params.roles.memory_episodes} distinct imagined episodes.", "",
        "## Budget curve (gain: paired against N = 0 on the same tasks, 95% CI)", "",
        "| model | mode | N | success | gain | 95% CI | tokens/task | real calls/task |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, modes in summary["curve"].items():
        for mode, points in modes.items():
            for n, p in points.items():
                lines.append(f"| {name} | {mode} | {n} | {p['success']:.3f} | {p['gain']:+.3f} | "
                             f"[{p['gain_ci_low']:+.3f}, {p['gain_ci_high']:+.3f}] | {p['tokens_per_task']} | "
                             f"{p['real_calls_per_task']} |")
    lines += ["", "## The guard on high-risk calls in real contexts from the test split", "",
              "Harmful: the real backend rejects the call, or a checkable precondition is shown false. Informed: the real history holds the lookups that decide "
              "the tool's checkable preconditions. Rates with 95% Wilson intervals; the guard holds on a rehearsed "
              "error, an unreadable rehearsal, or a precondition the history shows false.", "",
              "| model | history | part | recall (harmful held) | false holds (safe held) | harmful / safe |",
              "|---|---|---|---|---|---|"]
    for name, g in summary["guard"].items():
        for kind in ("informed", "uninformed"):
            row = g[kind]
            for part, r in (("guard", row), ("rehearsal only", row["rehearsal_only"]),
                            ("preconditions only", row["preconditions_only"])):
                lines.append(f"| {name} | {kind} | {part} | {_fmt(r['recall'], r['recall_ci'])} | "
                             f"{_fmt(r['false_hold'], r['false_hold_ci'])} | {r['n_harmful']} / {r['n_safe']} |")
            for tool, r in row["per_tool"].items():
                lines.append(f"| {name} | {kind} | guard: `{tool}` | {_fmt(r['recall'], r['recall_ci'])} | "
                             f"{_fmt(r['false_hold'], r['false_hold_ci'])} | {r['n_harmful']} / {r['n_safe']} |")
    lines += ["", f"End to end, N = 0, `guard.on_hold: {params.guard.on_hold}`:", "",
              "| model | success guard off | success guard on | harmful real actions off | on | holds |",
              "|---|---|---|---|---|---|"]
    for name, g in summary["guard"].items():
        lines.append(f"| {name} | {g['success_off']:.3f} | {g['success_on']:.3f} | {g['harmful_executed_off']} | "
                     f"{g['harmful_executed_on']} | {g['holds_on']} |")
    lines += ["", f"Tasks (an even spread of the test split): {' '.join(summary['tasks'])}", ""]
    return "\n".join(lines)


def plot_png(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for series in [k for k in rows[0] if k != "budget"]:
        ax.plot([r["budget"] for r in rows], [r[series] for r in rows], marker="o", label=series.replace("_", " "))
    ax.set_xscale("symlog", base=2)
    ax.set_xlabel("private rehearsals N")
    ax.set_ylabel("real success")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _log_run(summary: dict, params: Params, traced: dict) -> None:
    """Into the flow's run of this stage (ENVACE_MLFLOW_RUN_ID), else a run `rehearse`: the
    headline numbers, the report, the curve as a PNG, and a few episodes as traces."""
    import tempfile

    import mlflow

    from envace.rehearsal import Guard, play
    from envace.rehearsal.trace import log_trace
    from envace.tracking import experiment_id, flatten, log_to_run, variant_run

    stage_run = os.environ.get("ENVACE_MLFLOW_RUN_ID")
    if stage_run:
        mlflow.set_experiment(experiment_id=experiment_id(Path.cwd()))
    run = mlflow.start_run(run_id=stage_run) if stage_run else variant_run("rehearse", {"stage": "rehearse"})
    with run, tempfile.TemporaryDirectory() as tmp:
        metrics = {"private_real_calls": summary["private_real_calls"]}
        for name, modes in summary["curve"].items():
            for mode, points in modes.items():
                metrics.update({f"{name}.{mode}.N{n}.success": p["success"] for n, p in points.items()})
        metrics.update(flatten({k: {kk: vv for kk, vv in g.items() if kk in ("success_off", "success_on",
                                                                                  "harmful_executed_off", "harmful_executed_on")}
                                for k, g in summary["guard"].items()}, "guard.", numbers_only=True))
        png = plot_png(curve_rows(summary["curve"]), Path(tmp) / PNG.name)
        # inside the flow the stage's params are logged by the flow itself
        log_to_run({} if stage_run else flatten(params.rehearse.model_dump(), "rehearse."), metrics, {},
                   [REPORT, METRICS, png])
        for name, (policy, sample) in traced.items():  # a few episodes as they run with both parts on
            guard = Guard(policy, params.rollout.max_new_tokens, params.guard.on_hold)
            real, imagined = play(policy, sample, params.rollout, 2, "sequential", guard, params.roles.memory_episodes,
                                  params.rehearse.temperature, params.rehearse.seed)
            for episode, rehearsals in zip(real, imagined):
                log_trace(episode, rehearsals, name, flush=False)
        mlflow.flush_trace_async_logging()  # every trace written before the run ends


if __name__ == "__main__":
    from envace.stages import main

    main("rehearse", run)
