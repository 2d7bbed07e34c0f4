"""Warmup: supervised fine-tuning of both roles on real trajectories (LightningModule).

Loss = L_act + lambda_env * L_rehearse, each the mean NLL over the tokens that role wrote
in the real logs; every other token (prompt, tool responses as context, padding) is
masked out; plus, under `warmup.copy_weight`, that weight times the copy loss on a few
copy rows (`envace.model.copying`). AdamW with linear warmup then cosine decay.
"""

from __future__ import annotations

import math

import lightning as L
import torch

from envace.io import write_csv
from envace.model.copying import copy_loss, kept_rows
from envace.train import is_sharded_strategy, rank_divergence, shard, sync_replica
from envace.train.losses import warmup_loss


class WarmupModule(L.LightningModule):
    """SFT of `model`. `policy` (optional) generates for the measurements: under FSDP its model
    becomes the unsharded replica, refreshed by `refresh()` before each measurement."""

    def __init__(self, model, lr: float, weight_decay: float, warmup_steps: int, total_steps: int, lambda_env: float,
                 min_lr_ratio: float = 0.1, policy=None, copy_weight: float = 0.0, copy_vocab=(), copy_seed: int = 0):
        super().__init__()
        self.copy_weight, self.copy_vocab, self.copy_seed = copy_weight, list(copy_vocab), copy_seed
        self.model = model
        self.min_lr_ratio = min_lr_ratio
        self.lr, self.weight_decay = lr, weight_decay
        self.warmup_steps, self.total_steps, self.lambda_env = warmup_steps, max(total_steps, 1), lambda_env
        self.rank_divergence = 0.0
        self.policy = policy
        object.__setattr__(self, "replica", None)  # not a submodule: never trained nor checkpointed

    def configure_model(self) -> None:
        if is_sharded_strategy(self.trainer) and self.replica is None:
            self.model, replica = shard(self.model, self.trainer.strategy)
            object.__setattr__(self, "replica", replica)
            if self.policy is not None:
                self.policy.model = replica

    def refresh(self) -> None:
        """Under FSDP: the replica takes the current weights (every rank: a gather)."""
        if self.replica is not None:
            sync_replica(self.model, self.replica)

    def on_train_end(self) -> None:
        self.refresh()
        weights = self.replica.parameters() if self.replica is not None else None
        self.rank_divergence = rank_divergence(self, weights)  # 0.0: every rank ends with the same weights

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if self.replica is not None and gradient_clip_val:  # FSDP: the norm over every rank's shards
            self.model.clip_grad_norm_(gradient_clip_val)
        else:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def training_step(self, batch, batch_idx):
        parts = warmup_loss(self.model, batch, self.lambda_env)
        n = batch["input_ids"].shape[0]
        self.log("train/loss", parts["loss"], prog_bar=True, batch_size=n)
        for role in ("act", "rehearse"):  # a batch without a role's tokens has no loss for it, not a 0
            if parts[f"{role}_tokens"]:
                self.log(f"train/{role}_loss", parts[role], prog_bar=True, batch_size=n)
        if self.copy_weight:
            ids, mask = kept_rows(self.copy_vocab, self.copy_seed, self.global_step)
            copy, _ = copy_loss(self.model, ids.to(self.device), mask.to(self.device))
            self.log("train/copy_loss", copy, batch_size=ids.shape[0])
            return parts["loss"] + self.copy_weight * copy
        return parts["loss"]

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters only
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, betas=(0.9, 0.98))

        def schedule(step: int) -> float:
            if step < self.warmup_steps:
                return (step + 1) / self.warmup_steps
            progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
            return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class StepCurve(L.Callback):
    """Losses every 10 steps → a CSV that DVC shows as a plot."""

    def __init__(self, path):
        self.path, self.rows = path, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = trainer.callback_metrics
        if trainer.global_step % 10 == 0 and {"train/act_loss", "train/rehearse_loss"} <= set(m):
            self.rows.append({"step": trainer.global_step, "act_loss": round(float(m["train/act_loss"]), 4),
                              "rehearse_loss": round(float(m["train/rehearse_loss"]), 4)})

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            write_csv(self.path, self.rows)

    def state_dict(self):  # a resumed run's curve continues the killed one's
        return {"rows": self.rows}

    def load_state_dict(self, state):
        self.rows = state["rows"]
