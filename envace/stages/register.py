"""register — the trained agent into the MLflow model registry, promoted only when better.

Logs `models/train/<registry.variant>` as an MLflow pyfunc model (`envace.registry.EnvaceAgent`),
registers it as a new version of `registry.model_name` with alias `challenger`, and moves
`champion` to it only if the promotion suite (Great Expectations, `envace.gates.promotion`)
passes: its held-out success in the real backends (from `evaluate`) beats the current
champion's on the same test tasks, and it made no more real calls in training. The version's tags carry the data version
(the md5 of `data/prepared` in dvc.lock), the git commit and the params.

Writes `metrics/register.json` and `reports/register.md` (the comparison; the flow also
publishes it as the Prefect artifact `registry`). Load the result with
`mlflow.pyfunc.load_model("models:/envace-agent@champion").predict(task)`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import yaml

from envace.config import Params
from envace.data.splits import spread
from envace.io import read_jsonl, write_json, write_text
from envace.paths import EVAL_METRICS, PREPARED, TRAIN_MODELS
from envace.stages import StageFailed

METRICS = Path("metrics/register.json")
REPORT = Path("reports/register.md")


def run(params: Params) -> dict[str, Path]:
    """Register the trained agent; promote it to champion only if it beats the champion."""
    from envace import registry

    cfg = params.registry
    model_dir = TRAIN_MODELS / cfg.variant
    if not any((model_dir / f).exists() for f in ("config.json", "adapter_config.json")):
        raise StageFailed(f"no trained model in {model_dir}: run the train stage first (`dvc repro train`)")
    if not EVAL_METRICS.exists():
        raise StageFailed(f"{EVAL_METRICS} is missing: run the evaluate stage first")
    evaluation = json.loads(EVAL_METRICS.read_text())
    if not evaluation.get("available", True):
        raise StageFailed(f"nothing to register on: real-environment evaluation was not possible ({evaluation['reason']}); "
                          "a logs-only project stops after evaluate (`envace run --until evaluate`)")
    evaluated = evaluation["variants"].get(cfg.variant)
    if evaluated is None:
        raise StageFailed(f"{EVAL_METRICS} holds no result for variant {cfg.variant!r}")
    tasks = [e["task"] for e in spread(list(read_jsonl(PREPARED / "test.jsonl")), params.evaluate.tasks)]
    config = {"rollout": params.rollout.model_dump(), "trainer": params.trainer.model_dump(),
              "max_seq_len": params.model.max_seq_len, "memory_episodes": params.roles.memory_episodes,
              "domains": [str(Path(d).resolve()) if Path(d).is_dir() else d for d in params.collect.domains]}
    result = registry.register(model_dir, evaluated["success"], evaluated["n"], tasks, config, cfg.model_name,
                               version_tags(params), evaluated["real_env_calls_train"], params.model_dump())
    write_json(METRICS, result.to_dict())
    write_text(REPORT, report(result))
    print(f"register: {cfg.model_name} v{result.version} is challenger; "
          f"{'PROMOTED to champion' if result.promoted else 'champion unchanged'} ({result.reason})", flush=True)
    return {"metrics": METRICS, "report": REPORT}


def version_tags(params: Params) -> dict[str, str]:
    """Where a version came from: data version (dvc.lock), git commit, the params' md5."""
    dumped = json.dumps(params.model_dump(), sort_keys=True)
    return {"data_version": data_version(), "git_commit": git_commit(), "params_md5": hashlib.md5(dumped.encode()).hexdigest(),
            "variant": params.registry.variant}  # the params themselves: `params.yaml` on the version's run


def data_version(lock: Path = Path("dvc.lock")) -> str:
    """One hash of what DVC pinned under `data/prepared` (the data the agent was trained and
    tested on): equal data versions mean identical splits and tokenizer."""
    if not lock.exists():
        return "unknown"
    stage = (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).get("prepare", {})
    pinned = sorted(f"{o['path']}:{o['md5']}" for o in stage.get("outs", []) if o["path"].startswith(f"{PREPARED}/"))
    return hashlib.md5("\n".join(pinned).encode()).hexdigest() if pinned else "unknown"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def report(r) -> str:
    champion = "none" if r.champion_version is None else f"v{r.champion_version}: {r.champion_success:.4f}"
    verdict = f"**promoted**: v{r.version} is now `champion`" if r.promoted else "**not promoted**: champion unchanged"
    lines = [
        f"# register: {r.model_name} v{r.version} {'promoted' if r.promoted else 'kept as challenger'}", "",
        f"Held-out success in the real backends on the same {r.n_tasks} test tasks:", "",
        "| model | success |", "|---|---|",
        f"| challenger v{r.version} | {r.challenger_success:.4f} |",
        f"| champion before | {champion} |", "",
        f"{verdict} ({r.reason}).", "",
    ]
    if r.expectations:
        lines += ["Promotion suite (Great Expectations):", "", "| check | result | observed |", "|---|---|---|"]
        lines += [f"| {e['name']} | {'passed' if e['success'] else 'failed'} | "
                  f"{e['unexpected_count']} bad row(s) |" for e in r.expectations]
        lines.append("")
    lines += [f"Load: `mlflow.pyfunc.load_model(\"models:/{r.model_name}@champion\")`; MLflow run `{r.run_id}`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    from envace.stages import main

    main("register", run)
