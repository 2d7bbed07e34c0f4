"""Does a killed warmup resume cheaply and end where an uninterrupted one ends? Side by side.

In a scratch copy of the prepared data and base model (the project is not touched), runs the
warmup stage twice with the project's params.yaml: once uninterrupted, once kill -9'd as soon
as the epoch at `--kill-at` of its epochs (default 70%) has been checkpointed and then run
again. Prints both wall times, their ratio (killed + rerun over uninterrupted) and whether the
weights are byte-identical. Needs the data stages and base_model first (`make run`).

    .venv/bin/python bench/resume.py                 # the default profile: ~2 warmups of CPU time
    .venv/bin/python bench/resume.py --kill-at 0.5
    .venv/bin/python bench/resume.py --reference .   # compare with the project's own warmup (models/warmup,
                                                     # metrics/warmup.json) instead of a second one: half the
                                                     # time, but not side by side
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE = [sys.executable, "-m", "envace.stages.warmup", "--params", str(ROOT / "params.yaml")]
WEIGHTS = "models/warmup/model.safetensors"


def scratch(base: Path, name: str) -> Path:
    """A project folder holding only what warmup reads."""
    where = base / name
    for part in ("data/prepared", "models/base"):
        shutil.copytree(ROOT / part, where / part)
    (where / "envace").symlink_to(ROOT / "envace")
    return where


def uninterrupted(where: Path) -> float:
    start = time.perf_counter()
    subprocess.run(STAGE, cwd=where, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def killed_and_rerun(where: Path, kill_epoch: int) -> tuple[float, float, str]:
    """kill -9 once epoch `kill_epoch` is printed (its checkpoint is written before the line),
    then rerun. → (seconds until killed, seconds of the rerun, the rerun's resume line)."""
    start = time.perf_counter()
    proc = subprocess.Popen(STAGE, cwd=where, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        match = re.match(r"epoch (\d+) ", line)
        if match and int(match.group(1)) >= kill_epoch:
            break
    checkpoint = where / "checkpoints/warmup/last.ckpt"
    seen = checkpoint.stat().st_mtime if checkpoint.exists() else 0.0
    while proc.poll() is None and (not checkpoint.exists() or checkpoint.stat().st_mtime == seen):
        time.sleep(0.05)  # the epoch's checkpoint lands after its line: wait for the file to change
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = time.perf_counter() - start
    start = time.perf_counter()
    again = subprocess.run(STAGE, cwd=where, capture_output=True, text=True, check=True)
    resumed = next((line for line in again.stdout.splitlines() if "resuming from checkpoint" in line), "NOT RESUMED")
    return first, time.perf_counter() - start, resumed


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kill-at", type=float, default=0.7, help="share of the epochs done before the kill")
    parser.add_argument("--reference", type=Path, help="a project whose warmup is the uninterrupted run (its timings/warmup.json)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.reference:
            plain = args.reference.resolve()
            plain_s = json.loads((plain / "timings/warmup.json").read_text())["wall_s"]
        else:
            plain = scratch(Path(tmp), "uninterrupted")
            plain_s = uninterrupted(plain)
        epochs = json.loads((plain / "metrics/warmup.json").read_text())["epochs"]
        kill_epoch = max(1, int(epochs * args.kill_at))
        killed = scratch(Path(tmp), "killed")
        first, rerun, resumed = killed_and_rerun(killed, kill_epoch)
        same = md5(plain / WEIGHTS) == md5(killed / WEIGHTS)
        total = first + rerun
        print(f"warmup uninterrupted: {epochs} epochs in {plain_s:.0f} s")
        print(f"killed after epoch {kill_epoch} of {epochs} at {first:.0f} s, rerun {rerun:.0f} s ({resumed.strip()})")
        print(f"killed + rerun / uninterrupted: {total / plain_s:.2f}x; weights identical: {same}")


if __name__ == "__main__":
    main()
