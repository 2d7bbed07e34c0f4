"""Training: the warmup SFT LightningModule, role-wise GRPO, the losses, and where they run.

Data parallelism comes in two kinds (`trainer.strategy`). `ddp`: every rank holds the whole
model. `fsdp`: the decoder layers' weights, gradients and optimizer state are sharded over
the ranks (`shard`); generation — rollouts, the gate, the evaluation — needs the whole model
at once, so each rank keeps an unsharded *replica* for it, refreshed from the shards
(`sync_replica`, a gather) before each rollout and each measurement.
"""

from __future__ import annotations

import copy

from envace.config import TrainerConfig

VARIANTS = ("sft", "real_env", "simulator", "envace")  # `sft` trains nothing: the warmup model itself


def trainer_options(cfg: TrainerConfig) -> dict:
    """Lightning Trainer arguments for `cfg`: accelerator, devices, strategy and precision.
    Batches are global and each stage shards them itself (`use_distributed_sampler=False`)."""
    import torch

    from envace.model import cpu_threads, precision_of

    strategy = cfg.strategy
    cpu = cfg.accelerator == "cpu" or not torch.cuda.is_available()
    if cfg.strategy == "ddp" and cpu:
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy(process_group_backend="gloo")
    if cfg.strategy == "fsdp":
        strategy = _cpu_fsdp() if cpu else _fsdp()()
    if cpu:  # the CPU's cores are shared by the ranks
        torch.set_num_threads(cpu_threads(cfg.devices))
    quiet()
    return {"accelerator": cfg.accelerator, "devices": cfg.devices, "strategy": strategy,
            "precision": precision_of(cfg), "use_distributed_sampler": False, "enable_model_summary": False}


def quiet() -> None:
    """A stage prints its own lines (one per epoch), not the libraries' start-up notes: Lightning's
    "GPU available", tips and "creating experiment" lines, its deprecation warning about torch's
    pytree internals, MLflow's database set-up lines and transformers' bars for loading a few weights."""
    import logging
    import warnings

    import transformers

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
                 "lightning.pytorch.loggers.mlflow", "mlflow.store.db.utils", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    transformers.utils.logging.disable_progress_bar()


def _fsdp():
    from lightning.pytorch.strategies import FSDPStrategy

    return FSDPStrategy


def _cpu_fsdp():
    """FSDP over gloo on the CPU (Lightning allows FSDP on GPUs only; this is how the 2-process
    CPU test and a laptop run it). The models wrap themselves (`shard`) for the CPU device, and
    full state dicts are gathered without Lightning's "offload to the CPU" (already there: on
    CPU tensors it crashes the process)."""
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def gathered(module):
        return FSDP.state_dict_type(module, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True),
                                    FullOptimStateDictConfig(rank0_only=True))

    class CPUFSDPStrategy(_fsdp()):
        def lightning_module_state_dict(self):
            with gathered(self.model):
                return self.model.state_dict()

        def optimizer_state(self, optimizer):
            from torch.distributed.fsdp import OptimStateKeyType

            optimizer = getattr(optimizer, "_optimizer", optimizer)
            with gathered(self.model):
                state = FSDP.optim_state_dict(self.model, optimizer)
                if self.global_rank == 0:
                    state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
                return state

    return CPUFSDPStrategy(process_group_backend="gloo")


def is_sharded_strategy(trainer) -> bool:
    return isinstance(trainer.strategy, _fsdp())


def shard(model, strategy):
    """(the model with its decoder layers FSDP-sharded, an unsharded replica of it for
    generation). `use_orig_params` keeps the parameters' names and shapes (LoRA, optimizers)."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from envace.model import unwrapped

    layer = type(unwrapped(model).get_decoder().layers[0])
    replica = copy.deepcopy(model).requires_grad_(False).eval()
    device = strategy.root_device
    sharded = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({layer}), use_orig_params=True,
                   mixed_precision=strategy.mixed_precision_config,
                   device_id=device if device.type == "cpu" else device.index)
    return sharded, replica.to(device if device.type != "cpu" else torch.device("cpu"))


def sync_replica(sharded, replica) -> None:
    """Copy the sharded model's current weights into the replica (every rank: a gather)."""
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.state_dict_type(sharded, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=False, rank0_only=False)):
        state = sharded.state_dict()
    replica.load_state_dict(state)


def rank_divergence(module, parameters=None) -> float:
    """The largest difference, across data-parallel ranks, of a per-tensor checksum of the
    weights (default: the module's; 0.0 with one process). Every rank must call it: it gathers."""
    import torch

    if module.trainer.world_size == 1:
        return 0.0
    sums = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().square().sum()])
                        for p in (parameters if parameters is not None else module.parameters())])  # [P, 2]
    gathered = module.all_gather(sums.to(module.device))  # [world, P, 2]
    return float((gathered - gathered[0]).abs().max())
