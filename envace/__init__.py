"""envace — train tool-using agents whose environment is rehearsed by the agent itself.

The library is importable without the orchestration stack (Prefect, MLflow, DVC):
`flows/` and `envace.tracking` are the only places that import those.
"""

__version__ = "0.1.0"


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
