"""envace — train tool-using agents whose environment is rehearsed by the agent itself.

The library is importable without the orchestration stack (Prefect, MLflow, DVC):
`flows/` and `envace.tracking` are the only places that import those.
"""

import os

__version__ = "0.1.0"


def _cores_allowed() -> int:
    """How many cores this process may run on: its CPU affinity (`taskset`, a container's
    cpuset) where the OS reports one, otherwise (macOS) the machine's count."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


# Read at import, before torch loads: an OpenMP runtime told to bind its threads
# (`OMP_PROC_BIND`, `GOMP_CPU_AFFINITY`) pins the main thread to the first core as torch
# loads, and an affinity read after that names that core alone.
CORES_ALLOWED = _cores_allowed()


def flush_denormals() -> None:
    """Compute with denormal floats (below 1.2e-38) as zero, in this process's CPU threads.

    A trained model is full of them — the far tails of a confident softmax and their
    gradients — and on many x86 CPUs each one takes a slow microcode path: on a 2-core Intel
    Xeon a warmup step of a half-trained model ran 2.2x faster with them flushed (one thread,
    the same losses), and the warmup stage ran at half the speed of the benches, which start
    from untrained weights. Call it first in a process, before torch's first parallel
    operator: a thread takes the setting from the thread that creates it, and torch creates
    its intra-op threads once, so setting it later reaches the calling thread only."""
    import torch

    torch.set_flush_denormal(True)


def finish(code: int) -> None:
    """End the process as the interpreter would, less its own teardown: other threads joined,
    exit handlers run (MLflow's, logging's), the standard streams flushed, then `os._exit`.
    The teardown this skips only frees memory the OS takes back anyway, and with torch,
    transformers, Lightning, MLflow and Great Expectations loaded it takes 1.3-1.7 s: as long
    as a small stage's own work."""
    import atexit
    import sys
    import threading

    threading._shutdown()  # what the interpreter does first: stop executors' workers, join threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
