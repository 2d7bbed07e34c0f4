"""Training: the warmup SFT LightningModule, role-wise GRPO, the losses, and where they run."""

from __future__ import annotations

import os

from envace.config import TrainerConfig


def trainer_options(cfg: TrainerConfig) -> dict:
    """Lightning Trainer arguments for `cfg`: accelerator, devices, strategy and precision.
    Batches are global and each stage shards them itself (`use_distributed_sampler=False`)."""
    import torch

    from envace.model import precision_of

    strategy = cfg.strategy
    if cfg.strategy == "ddp" and not torch.cuda.is_available():
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy(process_group_backend="gloo")
    if cfg.accelerator == "cpu" or not torch.cuda.is_available():  # the CPU's cores are shared by the ranks
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.devices))
    return {"accelerator": cfg.accelerator, "devices": cfg.devices, "strategy": strategy,
            "precision": precision_of(cfg), "use_distributed_sampler": False}


def rank_divergence(module) -> float:
    """The largest difference, across data-parallel ranks, of a per-tensor checksum of the
    module's weights (0.0 with one process). Every rank must call it: it gathers."""
    import torch

    if module.trainer.world_size == 1:
        return 0.0
    sums = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().square().sum()])
                        for p in module.parameters()])  # [P, 2]
    gathered = module.all_gather(sums.to(module.device))  # [world, P, 2]
    return float((gathered - gathered[0]).abs().max())
