"""Warmup: supervised fine-tuning of both roles on real trajectories (LightningModule).

Loss = L_act + lambda_env * L_rehearse, each the mean NLL over the tokens that role wrote
in the real logs; every other token (prompt, tool responses as context, padding) is
masked out; plus, under `warmup.copy_weight`, that weight times the copy loss on a few
copy rows (`envace.model.copying`). Muon for the decoder layers' weight matrices and AdamW for
the rest, or AdamW for all (`warmup.optimizer`), with linear warmup then cosine decay.
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
                 min_lr_ratio: float = 0.1, policy=None, copy_weight: float = 0.0, copy_vocab=(), copy_seed: int = 0,
                 optimizer: str = "adamw"):
        super().__init__()
        self.optimizer_name = optimizer
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
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]  # LoRA: the adapters only
        if self.optimizer_name == "muon":
            matrices = [p for n, p in named if is_layer_matrix(n, p)]
            opt = MuonAdamW(matrices, [p for n, p in named if not is_layer_matrix(n, p)], self.lr, self.weight_decay)
        else:
            opt = torch.optim.AdamW([p for _, p in named], lr=self.lr, weight_decay=self.weight_decay, betas=BETAS)

        def schedule(step: int) -> float:
            if step < self.warmup_steps:
                return (step + 1) / self.warmup_steps
            progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
            return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


BETAS = (0.9, 0.98)  # AdamW's


def is_layer_matrix(name: str, param: torch.Tensor) -> bool:
    """A weight matrix of a decoder layer (attention and MLP projections): what Muon updates.
    Embeddings (tied to the LM head: a lookup table, not a map between hidden states) and norms
    are not."""
    return param.ndim == 2 and ".layers." in name


class MuonAdamW(torch.optim.Optimizer):
    """Muon for `matrices` and AdamW for `others`, one optimizer (one schedule sets both rates).

    Muon steps along each matrix's momentum made orthogonal by Newton-Schulz iterations, so every
    direction of a matrix moves at one rate instead of the gradient's few largest ones; scaled as
    Moonshot's Muon is (0.2 · sqrt(the larger side)), a step is as large as AdamW's, so one `lr`
    serves both. The iterations run in float32 (`torch.optim.Muon` runs them in bfloat16: as
    fast here, but two data-parallel ranks, whose summed gradients round differently from one
    process's, then part by bfloat16's rounding instead of float32's). On the embedded default
    it reached the rehearsal gate's level in a third of AdamW's epochs (README: "Why 6 epochs").
    """

    MOMENTUM = 0.95  # Muon's, with Nesterov's look-ahead
    NEWTON_SCHULZ = ((3.4445, -4.7750, 2.0315), 5)  # the quintic's coefficients and iterations (Keller Jordan's)

    def __init__(self, matrices: list, others: list, lr: float, weight_decay: float):
        super().__init__([{"params": matrices, "muon": True}, {"params": others, "muon": False}],
                         {"lr": lr, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.mul_(1 - group["lr"] * group["weight_decay"])  # decoupled weight decay, both
                    (self._muon if group["muon"] else self._adamw)(p, self.state[p], group["lr"])
        return loss

    def _muon(self, p: torch.Tensor, state: dict, lr: float) -> None:
        momentum = state.setdefault("momentum_buffer", torch.zeros_like(p))
        momentum.lerp_(p.grad, 1 - self.MOMENTUM)
        p.add_(orthogonalised(p.grad.lerp(momentum, self.MOMENTUM), *self.NEWTON_SCHULZ),
               alpha=-lr * 0.2 * math.sqrt(max(p.shape)))

    @staticmethod
    def _adamw(p: torch.Tensor, state: dict, lr: float, eps: float = 1e-8) -> None:
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        state["step"] += 1
        (b1, b2), t = BETAS, state["step"]
        state["exp_avg"].lerp_(p.grad, 1 - b1)
        state["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
        denominator = (state["exp_avg_sq"] / (1 - b2**t)).sqrt_().add_(eps)
        p.addcdiv_(state["exp_avg"], denominator, value=-lr / (1 - b1**t))


def orthogonalised(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int) -> torch.Tensor:
    """Newton-Schulz's quintic iterations: `g` with its singular values pushed near 1 (to
    ~0.7-1.2: close enough, and far cheaper than an SVD), through the smaller side's Gram matrix."""
    a, b, c = coefficients
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / x.norm().clamp(min=1e-7)  # singular values at most 1, where the iterations converge
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if g.shape[0] > g.shape[1] else x


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
