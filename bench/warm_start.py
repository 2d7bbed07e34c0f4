"""Stage commands started cold against the same commands run by the flow's warm server.

In a scratch copy of the prepared data and the trained models (the project is not touched),
runs model stages' commands (`python -m envace.stages.<stage>`) as DVC runs them, in turn: once
cold, once with the warm server the flow starts (`envace.warm_start`), for `--rounds` rounds.
Prints each stage's wall time both ways, the time saved and the ratio, and checks that the
two ways write byte-identical outputs. Needs a finished pipeline first (`make run`).

    .venv/bin/python bench/warm_start.py              # base_model, rehearsal_gate, train@sft, evaluate
    .venv/bin/python bench/warm_start.py --rounds 3 --stages base_model rehearsal_gate
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envace import warm_start  # noqa: E402

COMMANDS = {  # stage -> (arguments, its outputs)
    "base_model": ([], ["models/base", "metrics/base_model.json"]),
    "rehearsal_gate": ([], ["metrics/rehearsal.json", "reports/rehearsal_gate.md"]),
    "train@sft": (["--variant", "sft"], ["models/train/sft", "metrics/train/sft.json"]),
    "evaluate": ([], ["metrics/eval.json", "reports/eval.md"]),
}
NEEDS = ("data/prepared", "models/base", "models/warmup", "models/train", "metrics/train", "params.yaml")


def scratch(base: Path) -> Path:
    """A project folder holding what the stages read, with the project's code."""
    where = base / "project"
    for part in NEEDS:
        source = ROOT / part
        if not source.exists():
            sys.exit(f"bench/warm_start.py: {part} is missing: run the pipeline first (make run)")
        (shutil.copytree if source.is_dir() else shutil.copy)(source, where / part)
    (where / "envace").symlink_to(ROOT / "envace")
    return where


def digest(project: Path, outputs: list[str]) -> str:
    h = hashlib.md5()
    for out in outputs:
        path = project / out
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                h.update(f.relative_to(project).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def run(project: Path, stage: str, env: dict) -> tuple[float, str]:
    args, outputs = COMMANDS[stage]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", f"envace.stages.{stage.split('@')[0]}", *args], cwd=project,
                          env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{project}/mlflow.db", **env},
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{stage} failed:\n{done.stderr[-2000:]}")
    return seconds, digest(project, outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stages", nargs="+", default=list(COMMANDS), choices=list(COMMANDS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = scratch(Path(tmp))
        times: dict = {(s, how): [] for s in args.stages for how in ("cold", "warm")}
        digests: dict = {}
        with warm_start.server(str(project)) as env:
            while not os.path.exists(env[warm_start.VARIABLE]):  # its imports done: listening
                time.sleep(0.1)
            for r in range(args.rounds):
                for stage in args.stages:
                    for how, extra in (("cold", {}), ("warm", env)) if r % 2 == 0 else (("warm", env), ("cold", {})):
                        seconds, out = run(project, stage, extra)
                        times[stage, how].append(seconds)
                        digests.setdefault(stage, set()).add(out)
                        print(f"round {r + 1} {stage:<15} {how}: {seconds:6.2f} s", flush=True)
    print(f"\n{'stage':<15} {'cold s':>8} {'warm s':>8} {'saved s':>8} {'warm/cold':>10}  outputs")
    saved = 0.0
    for stage in args.stages:
        cold, warm = (statistics.median(times[stage, how]) for how in ("cold", "warm"))
        saved += cold - warm
        same = "identical" if len(digests[stage]) == 1 else "DIFFER"
        print(f"{stage:<15} {cold:8.2f} {warm:8.2f} {cold - warm:8.2f} {warm / cold:10.2f}  {same}")
    print(f"saved per run of these stages (medians over {args.rounds} rounds): {saved:.1f} s")
    if any(len(d) > 1 for d in digests.values()):
        sys.exit("warm and cold runs wrote different outputs")


if __name__ == "__main__":
    main()
