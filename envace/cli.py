"""The `envace` command line. Heavy imports happen inside the commands, not at start-up."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _run(args) -> int:
    from envace import env

    root = Path(args.project_dir).resolve()
    if args.until is not None:  # checked before anything starts (Prefect, MLflow)
        import yaml

        from envace.project import ROOT

        names = list(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])  # a project's are the same
        if args.until not in names:
            print(f"envace run: --until {args.until!r} is not a stage; stages: {', '.join(names)}", file=sys.stderr)
            return 2
    env.configure(root)
    if args.profile:
        from envace.config import ParamsError, apply_profile

        try:
            changed = apply_profile(root / "params.yaml", root / "profiles" / f"{args.profile}.yaml")
        except ParamsError as err:
            print(f"envace run: {err}", file=sys.stderr)
            return 2
        print(f"profile {args.profile} written into params.yaml ({len(changed)} value(s); `git checkout params.yaml` "
              "returns to the default):\n  " + "\n  ".join(changed or ["(already applied)"]), flush=True)
    from flows.serve import ServeError, TemporaryPrefectServer  # the standard library only: Prefect is not imported

    # no server named: a temporary one of our own, booting while Prefect is imported
    server = None if os.environ.get("PREFECT_API_URL") else TemporaryPrefectServer()
    from flows.full_pipeline import envace_flow, get_ready

    try:
        if server is not None:
            get_ready(root)  # while the server boots
            server.wait()
        summary = envace_flow(project_dir=str(root), until=args.until)
    except ServeError as err:
        print(f"envace run: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # the flow already logged the details (the Prefect UI has them all)
        print(failure_lines(err), file=sys.stderr)
        return 1
    print(where_to_look(root, summary))
    return 0


def failure_lines(err: Exception) -> str:
    """The closing lines of a failed run: a failed stage's last lines that the terminal did not
    show as they came, then one line saying what failed (any other error in full)."""
    from flows.full_pipeline import StageError

    if not isinstance(err, StageError):
        return f"\nenvace run FAILED: {err}"
    unseen = [f"{err.stage} | {line}" for line in err.unseen]
    return "\n".join(["", *unseen, f"envace run FAILED: {str(err).splitlines()[0].rstrip(':')}"])


def where_to_look(root: Path, summary: dict) -> str:
    from envace.tracking import tracking_uri

    lines = ["", "envace pipeline finished", "", f"{'stage':<16}{'status':<12}seconds"]
    for stage, r in summary["stages"].items():
        lines.append(f"{stage:<16}{'ran' if r['ran'] else 'up to date':<12}{r['seconds']:.1f}")
    for stage, gate in summary["gates"].items():
        lines.append(f"gate {stage}: {gate}")
    data = root / "metrics" / "data.json"
    collect = root / "metrics" / "collect.json"
    if collect.exists():
        rate = json.loads(collect.read_text())["demonstrator_success"]
        lines.append(f"demonstrator success (real backends): {rate:.1%}")
    if data.exists():
        lines.append(f"splits: {json.loads(data.read_text())['splits']}")
    ran = set(summary["stages"])
    warmup, rehearsal = root / "metrics" / "warmup.json", root / "metrics" / "rehearsal.json"
    evaluation = root / "metrics" / "eval.json"
    if "warmup" in ran and warmup.exists():
        w = json.loads(warmup.read_text())
        lines.append(f"warmup: {w['epochs']} epoch(s); ACT greedy success in the real backends "
                     f"{w['real_success']:.1%} on {w['real']['n']} held-out tasks")
    if "rehearsal_gate" in ran and rehearsal.exists():
        r = json.loads(rehearsal.read_text())
        lines.append(f"rehearsal exact match: {r['overall']:.1%} with privileged facts, "
                     f"{r['overall_without_privileged']:.1%} without (gate {r['threshold']}: "
                     f"{'passed' if r['passed'] else 'FAILED'})")
    if "evaluate" in ran and evaluation.exists():
        for name, v in json.loads(evaluation.read_text())["variants"].items():
            lines.append(f"evaluate {name:<10} success {v['success']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}] "
                         f"on {v['n']} held-out tasks; real-backend calls in training {v['real_env_calls_train']}")
    rehearse = root / "metrics" / "rehearse.json"
    if "rehearse" in ran and rehearse.exists():
        r = json.loads(rehearse.read_text())
        for name, modes in r["curve"].items():
            best = max(((mode, n, p) for mode, points in modes.items() for n, p in points.items() if n != "0"),
                       key=lambda x: x[2]["gain"], default=None)
            g = r["guard"][name]
            if best:
                lines.append(f"rehearse {name:<8} best private-rehearsal gain {best[2]['gain']:+.3f} "
                             f"[{best[2]['gain_ci_low']:+.3f}, {best[2]['gain_ci_high']:+.3f}] ({best[0]}, N={best[1]}); "
                             f"guard recall {g['informed']['recall']} / false holds {g['informed']['false_hold']} "
                             f"(informed); harmful real actions {g['harmful_executed_off']} -> {g['harmful_executed_on']}")
    lines += [
        "",
        "Where to look:",
        f"  MLflow UI:   make serve-mlflow -> http://127.0.0.1:5000 (store {tracking_uri(root)}, experiment 'envace')",
        "  Prefect UI:  make serve-prefect -> http://127.0.0.1:4200 (flow runs envace-<time>-<sha>, task logs, artifacts)",
        "  DVC:         PATH=.venv/bin:$PATH dvc metrics show; dvc.lock pins every output",
        "  Reports:     reports/*.md; metrics/*.json; plots: .venv/bin/dvc plots show",
    ]
    return "\n".join(lines)


def _stage(args) -> int:
    import runpy

    from envace.stages import STAGES

    if args.name not in STAGES:
        print(f"unknown stage {args.name!r}; stages: {', '.join(STAGES)}", file=sys.stderr)
        return 2
    sys.argv = [f"envace.stages.{args.name}", "--params", args.params, *(["--variant", args.variant] if args.variant else [])]
    runpy.run_module(f"envace.stages.{args.name}", run_name="__main__")
    return 0


def _serve(args) -> int:
    from envace import env

    root = Path(args.project_dir).resolve()
    env.configure(root)
    from flows.serve import serve

    return serve(root, args.only)


def _act(args) -> int:
    from envace import flush_denormals
    from envace.act import act

    flush_denormals()
    return act(args)


def _schema(args) -> int:
    """The published format of a logged episode (one line of a domain's episodes.jsonl)."""
    from envace.data.logs import log_schema

    print(json.dumps(log_schema(), indent=2))
    return 0


def _check_params(args) -> int:
    from envace.config import ParamsError, load_params

    try:
        load_params(args.params)
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"{args.params}: ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="envace",
        description="Train tool-using agents that rehearse their environment (EnvACE). "
        "`envace run` runs the whole pipeline (Prefect flow over DVC stages).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the pipeline: the Prefect flow 'envace' over the DVC stages")
    p.add_argument("--project-dir", default=".", help="project root holding dvc.yaml and params.yaml")
    p.add_argument("--until", help="stop after this stage (default: run them all)")
    p.add_argument("--profile", help="first write profiles/NAME.yaml's values into params.yaml (e.g. smollm2-cpu)")
    p.set_defaults(func=_run)
    p = sub.add_parser("stage", help="run one stage directly (no DVC, no tracking)")
    p.add_argument("name", help="collect | prepare | validate_data | base_model | warmup | rehearsal_gate | train | evaluate | register")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--variant", help="train only: sft | real_env | simulator | envace (default envace)")
    p.set_defaults(func=_stage)
    p = sub.add_parser("serve", help="Prefect + MLflow servers on 127.0.0.1 and the deployment envace/full-pipeline")
    p.add_argument("--project-dir", default=".", help="project root holding dvc.yaml and params.yaml")
    p.add_argument("--only", choices=("prefect", "mlflow", "worker"), help="run one part alone (docker/compose.yaml)")
    p.set_defaults(func=_serve)
    p = sub.add_parser("act", help="play one task with the trained agent: private rehearsal first, the guard "
                       "on high-risk calls")
    p.add_argument("task", help="a test task id (data/prepared/test.jsonl) or a task JSON file")
    p.add_argument("--model", default="models:/envace-agent@champion",
                   help="a model directory or a registry URI (default: models:/envace-agent@champion)")
    p.add_argument("--rehearse", type=int, default=0, metavar="N", help="private rehearsals before acting (default 0)")
    p.add_argument("--mode", choices=("parallel", "sequential"), default="parallel", help="how they are sampled")
    p.add_argument("--guard", action="store_true", help="rehearse every high-risk call first; hold a bad one")
    answer = p.add_mutually_exclusive_group()
    answer.add_argument("--yes", action="store_true", help="run held calls anyway (scripts)")
    answer.add_argument("--no", action="store_true", help="keep held calls held (scripts)")
    p.add_argument("--seed", type=int, default=0, help="random stream of the private rehearsals")
    p.add_argument("--no-trace", action="store_true", help="do not log the episode as an MLflow trace")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--project-dir", default=".", help="project root (its MLflow store and test split)")
    p.set_defaults(func=_act)
    p = sub.add_parser("schema", help="print the JSON Schema of a logged episode (your logs' format)")
    p.set_defaults(func=_schema)
    p = sub.add_parser("check-params", help="validate params.yaml against the typed config")
    p.add_argument("--params", default="params.yaml")
    p.set_defaults(func=_check_params)
    args = parser.parse_args(argv)
    return args.func(args)


def command() -> None:
    """The `envace` command (and `python -m envace.cli`): `main`, then the process ends without
    the interpreter's teardown of Prefect, MLflow and torch (~1 s: `envace.finish`)."""
    from envace import finish

    finish(main())


if __name__ == "__main__":
    command()
