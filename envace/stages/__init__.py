"""Pipeline stages: one module each, `run(params) -> outputs`, runnable as
`python -m envace.stages.<name> [--params params.yaml]` (this is what dvc.yaml calls).

Paths are relative to the project root (DVC runs every stage there).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

STAGES = ("collect", "prepare", "validate_data", "base_model", "warmup", "rehearsal_gate", "train", "evaluate", "rehearse", "register")  # dvc.yaml order


class StageFailed(RuntimeError):
    """A stage (usually a gate) refuses to pass; the message says why."""


def main(name: str, run: Callable, variants: tuple[str, ...] = ()) -> None:
    from envace.config import ParamsError, load_params
    from envace.data.logs import LogError
    from envace.domains import DomainError, use_domains
    from envace.io import committed_together

    parser = argparse.ArgumentParser(prog=f"python -m envace.stages.{name}", description=run.__doc__)
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    if variants:
        parser.add_argument("--variant", choices=variants, default=variants[-1])
    args = parser.parse_args()
    start = time.perf_counter()
    try:
        params = load_params(args.params)
        use_domains(params.collect.domains, real_backends=params.collect.real_backends)
        with committed_together(keep_on=StageFailed):  # all outputs of this run, or none replaced
            outputs = run(params, *([args.variant] if variants else []))
    except (ParamsError, StageFailed, DomainError, LogError) as err:
        print(f"{name}: {err}", file=sys.stderr)
        sys.exit(1)
    print(f"{name}: done in {time.perf_counter() - start:.1f}s -> {', '.join(map(str, outputs.values()))}")
