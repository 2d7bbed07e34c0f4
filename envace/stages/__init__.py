"""Pipeline stages: one module each, `run(params) -> outputs`, runnable as
`python -m envace.stages.<name> [--params params.yaml]` (this is what dvc.yaml calls).

Paths are relative to the project root (DVC runs every stage there).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

STAGES = ("collect", "prepare", "validate_data", "base_model", "warmup", "rehearsal_gate", "train", "evaluate", "rehearse", "register", "summary")  # dvc.yaml order
MODEL_STAGES = ("base_model", "warmup", "rehearsal_gate", "train", "evaluate", "rehearse", "register")  # run a model (torch)


class StageFailed(RuntimeError):
    """A stage (usually a gate) refuses to pass; the message says why."""


def main(name: str, run: Callable, variants: tuple[str, ...] = ()) -> None:
    """Run stage `name` as its command: parse the arguments, run it, print what it wrote; end
    the process (`envace.finish`: the interpreter's teardown of the loaded libraries is skipped)."""
    from envace import finish, warm_start

    status = warm_start.run_in_server()  # under the flow: run by its warm server, imports done
    if status is not None:
        sys.exit(status)
    from envace.config import ParamsError, load_params
    from envace.data.logs import LogError
    from envace.domains import DomainError, use_domains
    from envace.io import DataError, committed_together

    parser = argparse.ArgumentParser(prog=f"python -m envace.stages.{name}", description=run.__doc__)
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    if variants:
        parser.add_argument("--variant", choices=variants, default=variants[-1])
    args = parser.parse_args()
    start = time.perf_counter()  # the stage's own time: its imports (torch's first) included
    if name in MODEL_STAGES:  # before torch starts its threads (the data stages never import it)
        from envace import flush_denormals

        flush_denormals()
    try:
        params = load_params(args.params)
        installed: list = []
        try:
            use_domains(params.collect.domains, real_backends=params.collect.real_backends)
            with committed_together(keep_on=StageFailed, installed=installed):  # all of this run's, or none
                outputs = run(params, *([args.variant] if variants else []))
        except BaseException:  # what the failed run did not rewrite no longer describes its inputs
            remove_stale_outputs(name, getattr(args, "variant", None), installed)
            raise
    except Exception as err:
        # bad input the message explains (a checkpoint error can only come from a loaded model module)
        model = sys.modules.get("envace.model")
        explained = (ParamsError, StageFailed, DomainError, LogError, DataError, *([model.CheckpointError] if model else []))
        if not isinstance(err, explained):
            raise
        print(f"{name}: {err}", file=sys.stderr)
        finish(1)
    print(f"{name}: done in {time.perf_counter() - start:.1f}s -> {', '.join(map(str, outputs.values()))}")
    finish(0)


def remove_stale_outputs(stage: str, variant: str | None, keep: list) -> None:
    """Remove the outputs dvc.yaml declares for `stage` that a failed run did not write (as DVC
    does before it runs a stage): a gate that failed early must not leave the last run's
    "passed" verdict behind. Without a dvc.yaml here, nothing is removed."""
    import shutil
    from pathlib import Path

    import yaml

    if not Path("dvc.yaml").exists():
        return
    spec = (yaml.safe_load(Path("dvc.yaml").read_text()) or {}).get("stages", {}).get(stage, {})
    body = spec.get("do", spec)
    for entry in body.get("outs", []) + body.get("metrics", []) + body.get("plots", []):
        path = Path(str(next(iter(entry)) if isinstance(entry, dict) else entry).replace("${item}", variant or ""))
        if "${" in str(path) or path in keep or not path.exists():
            continue
        shutil.rmtree(path) if path.is_dir() else path.unlink()
