"""Results across seeds: the pipeline up to `evaluate` (and `summary`) once per training seed, as DVC experiments.

    make seeds            (= python -m envace.seeds --seeds 0 1 2)

queues one DVC experiment per seed (`dvc exp run --queue -S model.seed=S -S warmup.seed=S
-S train.seed=S summary`: the data stays the same, the model's initialisation, warmup's
batch order and GRPO's sampling change; `--vary train.seed` varies GRPO's alone, so every
seed shares one warmup and costs only the RL stages), runs the queue (`dvc exp run
--run-all`, one at a time, each stage forked from one warm server as the flow's are: DVC runs an
experiment in a copy of the project, whose code the server checks is its own), reads each
experiment's `metrics/eval.json` from its git commit and writes:

- `metrics/seeds.json`: {"seeds", "varied", "tasks", "failed": {seed: reason},
  "variants": {name: {"mean", "min", "max", "seeds": [success per seed], "ci_low", "ci_high", "n"}}}
  — ci_* is the 95% Wilson interval of the successes pooled over the seeds (n tasks in all);
- `reports/seeds.md`: the same as a table.

`dvc exp show` lists the experiments (named `seed-S`) beside the workspace, each with its own
headline (`summary` reads the stages up to `evaluate` only; the registry is left alone). A seed
whose pipeline fails (a gate stops it) is reported as failed, never left out silently.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import mean

from envace import warm_start
from envace.evaluate import wilson
from envace.io import write_json, write_text
from envace.paths import EVAL_METRICS

METRICS = Path("metrics/seeds.json")
REPORT = Path("reports/seeds.md")
VARIED = ("model.seed", "warmup.seed", "train.seed")


def name(seed: int) -> str:
    return f"seed-{seed}"


def dvc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "dvc", *args], text=True, capture_output=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"`dvc {' '.join(args)}` failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return out


def run_experiments(seeds: list[int], varied: list[str]) -> None:
    """Queue one experiment per seed (replacing an older one of the same name) and run them."""
    for seed in seeds:
        dvc("exp", "remove", name(seed), check=False)  # absent the first time
        overrides = [arg for key in varied for arg in ("-S", f"{key}={seed}")]
        dvc("exp", "run", "--queue", "-n", name(seed), *overrides, "summary")
        print(f"seeds: queued {name(seed)} ({', '.join(f'{k}={seed}' for k in varied)})", flush=True)
    print(f"seeds: running {len(seeds)} experiment(s) one at a time (`dvc queue status` shows progress)", flush=True)
    with warm_start.server(os.getcwd()) as warm:  # DVC's queue worker inherits the environment
        subprocess.run([sys.executable, "-m", "dvc", "exp", "run", "--run-all", "-j", "1"], check=False,
                       env={**os.environ, **warm})


def experiment_revs(seeds: list[int]) -> dict[int, str | None]:
    """The git commit of each seed's newest finished experiment (None when none finished). DVC
    keeps a finished experiment as a ref `refs/exps/<baseline>/<name>`; read by name, so a
    commit made while the queue ran (a new baseline) does not hide them."""
    refs = subprocess.run(["git", "for-each-ref", "refs/exps", "--sort=-committerdate", "--format=%(refname) %(objectname)"],
                          text=True, capture_output=True, check=True).stdout.split("\n")
    newest: dict[str, str] = {}
    for line in filter(None, refs):
        ref, rev = line.split()
        newest.setdefault(ref.rsplit("/", 1)[-1], rev)
    return {seed: newest.get(name(seed)) for seed in seeds}


def eval_of(rev: str) -> dict:
    shown = subprocess.run(["git", "show", f"{rev}:{EVAL_METRICS}"], text=True, capture_output=True)
    if shown.returncode != 0:
        raise RuntimeError(f"experiment {rev} holds no {EVAL_METRICS}: {shown.stderr.strip()}")
    return json.loads(shown.stdout)


def summarise(results: dict[int, dict], failed: dict[int, str], varied: list[str] = list(VARIED)) -> dict:
    """Per variant: success per seed, its mean / min / max, the pooled Wilson interval."""
    seeds = sorted(results)
    names = sorted({v for r in results.values() for v in r["variants"]})
    variants = {}
    for v in names:
        per_seed = [results[s]["variants"][v] for s in seeds if v in results[s]["variants"]]
        successes = sum(round(r["success"] * r["n"]) for r in per_seed)
        n = sum(r["n"] for r in per_seed)
        low, high = wilson(successes, n)
        rates = [r["success"] for r in per_seed]
        variants[v] = {"mean": round(mean(rates), 4), "min": min(rates), "max": max(rates), "seeds": rates,
                       "ci_low": low, "ci_high": high, "n": n}
    tasks = sorted({r["variants"][v]["n"] for r in results.values() for v in r["variants"]})
    return {"seeds": seeds, "varied": list(varied), "tasks": tasks[0] if len(tasks) == 1 else tasks,
            "failed": {str(s): why for s, why in failed.items()}, "variants": variants}


def report(s: dict) -> str:
    lines = [f"# Results across seeds ({', '.join(map(str, s['seeds']))})", "",
             f"Each seed runs the pipeline to `evaluate` with {', '.join(s['varied'])} set to it (the data is the same"
             f"{'' if len(s['varied']) > 1 else '; every other seed is fixed, so the seeds share everything upstream'}). "
             f"Success on the same {s['tasks']} held-out test tasks in the real backends; the interval pools every seed's "
             "tasks (95% Wilson) — the seeds replay the same tasks, so it treats their episodes as independent and is "
             "narrower than the uncertainty from task sampling; min and max show the spread between seeds.", "",
             "| variant | mean | min | max | per seed | pooled 95% CI |", "|---|---|---|---|---|---|"]
    for v, d in sorted(s["variants"].items(), key=lambda kv: -kv[1]["mean"]):
        lines.append(f"| {v} | {d['mean']:.3f} | {d['min']:.3f} | {d['max']:.3f} | "
                     f"{' / '.join(f'{x:.3f}' for x in d['seeds'])} | [{d['ci_low']:.3f}, {d['ci_high']:.3f}] |")
    for seed, why in s["failed"].items():
        lines.append(f"\n**seed {seed} failed**: {why}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envace.seeds", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--vary", nargs="+", default=list(VARIED), choices=VARIED, metavar="KEY",
                        help=f"the seeds set to each value (default: all of {', '.join(VARIED)})")
    parser.add_argument("--report-only", action="store_true", help="summarise experiments that already ran")
    args = parser.parse_args(argv)
    if not args.report_only:
        run_experiments(args.seeds, args.vary)
    results, failed = {}, {}
    for seed, rev in experiment_revs(args.seeds).items():
        if rev is None:
            failed[seed] = f"experiment {name(seed)} did not finish (`dvc queue logs` says why)"
        else:
            results[seed] = eval_of(rev)
    if not results:
        print(f"seeds: no experiment finished: {failed}", file=sys.stderr)
        return 1
    summary = summarise(results, failed, args.vary)
    write_json(METRICS, summary)
    write_text(REPORT, report(summary))
    print(report(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
