"""Resuming a killed training stage where it stopped.

Each training stage writes its whole state (weights, optimizer, scheduler, loop counters and
its own callbacks' state) to `<dir>/last.ckpt` after every step (GRPO) or every epoch
(warmup), written aside and renamed, so a `kill -9` mid-write leaves the previous one
intact. `<dir>/fingerprint` says what the checkpoint is valid for: the params the stage
reads and the files it trains from. A rerun with the same fingerprint resumes from it; any
other run starts over. The stage removes the directory once its outputs are written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from envace.config import Params


def last_checkpoint(path: Path, every: str = "step"):
    """A Lightning callback saving the whole training state after every step or every epoch
    ("step" | "epoch"), atomically. It runs after the callbacks listed before it."""
    import lightning as L

    def save(trainer) -> None:
        part = path.with_suffix(".part")
        trainer.save_checkpoint(part, weights_only=False)  # every rank (a barrier); rank 0 writes
        if trainer.is_global_zero:  # the whole state: resuming needs the optimizer
            os.replace(part, path)

    class _LastCheckpoint(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if every == "step":
                save(trainer)

        def on_train_epoch_end(self, trainer, *args):
            if every == "epoch":
                save(trainer)

    return _LastCheckpoint()


def fingerprint(params: Params, sections: tuple[str, ...], inputs: list[Path]) -> str:
    """What a checkpoint is valid for: the params sections a stage reads and the bytes of the
    files it trains from (a folder: every file in it)."""
    digest = hashlib.md5()
    dumped = params.model_dump()
    digest.update(json.dumps({k: dumped[k] for k in sections}, sort_keys=True).encode())
    for item in inputs:
        for f in sorted(Path(item).rglob("*")) if Path(item).is_dir() else [Path(item)]:
            if f.is_file():
                digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()


def resumable(ckpt_dir: Path, stamp: str, label: str, prepare: bool = True) -> Path | None:
    """The last checkpoint of an interrupted run with the same fingerprint, else None (and,
    with `prepare` — rank 0 — the directory is made ready for this run's checkpoints)."""
    last, stamp_file = ckpt_dir / "last.ckpt", ckpt_dir / "fingerprint"
    if last.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        import torch

        try:
            state = torch.load(last, map_location="cpu", weights_only=False)
        except Exception as err:  # noqa: BLE001 - torch raises many kinds for a damaged file
            state, why = None, f"unreadable ({type(err).__name__})"
        if state is not None:
            if prepare:
                print(f"{label}: resuming from checkpoint {last} (epoch {state['epoch'] + 1}, step "
                      f"{state['global_step']})", flush=True)
            return last
    else:
        why = "from other params or inputs"
    if prepare:
        if last.exists():
            print(f"{label}: checkpoint {last} is {why}; starting over", flush=True)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        ckpt_dir.mkdir(parents=True)
        stamp_file.write_text(stamp)
    return None
