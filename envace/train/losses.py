"""The losses, in one file. Shapes: B sequences, T tokens, H hidden, N selected targets.

`role_nll` computes next-token NLL only at positions whose next token a role generated
(logits for the other positions are never materialised: the LM head is a large share of
a small model's compute; for a plain Llama on the CPU, neither is the last layer's work at the
other positions, `lean.target_states`). Prompt, tool and padding tokens carry role 0 and are never
trained.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from envace.roles import ROLE_IDS
from envace.rollout import lean

ACT_ID, REHEARSE_ID = ROLE_IDS["act"], ROLE_IDS["rehearse"]


def role_targets(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, roles: torch.Tensor):
    """Logits at the positions whose next token a role wrote (others never reach the LM head).

    input_ids, attention_mask, roles: [B, T]; roles[b, t] is the role that wrote token t.
    Returns logits [N, V], targets [N], who [N] (role id), row [N] (batch row).
    """
    target_roles = roles[:, 1:]  # [B, T-1]: who wrote the token being predicted
    selected = target_roles > 0  # [B, T-1]
    row = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None].expand_as(selected)[selected]  # [N]
    if _sharded(model):  # FSDP: the embeddings and the head are gathered only by the root's forward
        keep = selected.any(0).nonzero().squeeze(-1)  # [K] positions some row predicts from
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits  # [B, K, V]
        logits = logits[selected[:, keep]].float()  # [N, V]
    elif lean.supports(model) and right_padded(attention_mask) and not (model.training and model.config.attention_dropout):
        logits = model.get_output_embeddings()(lean.target_states(model, input_ids[:, :-1], selected)).float()  # [N, V]
    else:
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
        logits = model.get_output_embeddings()(hidden[:, :-1][selected]).float()  # [N, V]
    return logits, input_ids[:, 1:][selected], target_roles[selected], row


def right_padded(attention_mask: torch.Tensor | None) -> bool:
    """Every row's tokens first, its pads after them (as `collate` makes batches); no mask: no pads.

    >>> right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]])), right_padded(torch.tensor([[0, 1, 1]]))
    (True, False)
    """
    return attention_mask is None or bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def _sharded(model) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def role_nll(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, roles: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per role: the summed next-token NLL of its targets (`act_sum`), their count
    (`act_tokens`) and their mean (`act`; 0 without targets). Inputs: [B, T]."""
    logits, targets, who, _ = role_targets(model, input_ids, attention_mask, roles)
    nll = F.cross_entropy(logits, targets, reduction="none")  # [N]
    out = {}
    for name, rid in (("act", ACT_ID), ("rehearse", REHEARSE_ID)):
        mine = who == rid
        out[f"{name}_sum"] = nll[mine].sum()
        out[f"{name}_tokens"] = mine.sum()
        out[name] = out[f"{name}_sum"] / out[f"{name}_tokens"].clamp(min=1)
    return out


def warmup_loss(model, batch: dict, lambda_env: float) -> dict[str, torch.Tensor]:
    """SFT on both roles: L = L_act + lambda_env * L_rehearse, each role's mean NLL over the
    global batch — `batch["act_per"]` (from `collate`) is the global batch's ACT targets / world
    size, so data-parallel ranks averaging their gradients get the global mean's. Without it,
    this batch's mean (the same with one process)."""
    parts = role_nll(model, batch["input_ids"], batch["attention_mask"], batch["roles"])
    terms = {}
    for name in ("act", "rehearse"):
        per = batch.get(f"{name}_per")
        terms[name] = parts[f"{name}_sum"] / per if per is not None else parts[name]
    parts["loss"] = terms["act"] + lambda_env * terms["rehearse"]
    return parts


# ---- Role-wise GRPO. E episodes, K tasks, S selected target tokens. ----------------------------


def role_advantages(rewards: torch.Tensor, task_of: torch.Tensor, has_role: torch.Tensor,
                    normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """One role's advantage per episode: reward minus the mean over the episodes of the same
    task in which this role wrote something (its own group baseline), optionally / std.
    Episodes where the role wrote nothing get 0 and do not enter the baseline.

    rewards: [E] float; task_of: [E] long (0..K-1); has_role: [E] bool → [E].

    >>> role_advantages(torch.tensor([1., 0., 0., 1.]), torch.tensor([0, 0, 0, 1]),
    ...                 torch.tensor([True, True, False, True]), normalize_std=False).tolist()
    [0.5, -0.5, 0.0, 0.0]
    """
    K = int(task_of.max()) + 1 if task_of.numel() else 0
    w = has_role.float()  # [E]
    count = torch.zeros(K).index_add_(0, task_of, w).clamp(min=1)  # [K]
    mean = torch.zeros(K).index_add_(0, task_of, rewards * w) / count  # [K]
    centred = torch.where(has_role, rewards - mean[task_of], 0.0)  # [E]
    if normalize_std:
        var = torch.zeros(K).index_add_(0, task_of, centred**2) / count  # [K] population variance
        centred = centred / (var.sqrt()[task_of] + eps)
    return centred


def token_weights(count: torch.Tensor, episode_of: torch.Tensor, n_wrote: float) -> torch.Tensor:
    """Weights for one role's tokens such that Σ weight · x is the mean, over the `n_wrote`
    episodes in which the role wrote, of each episode's token-mean of x: each episode counts
    once however long it is. The sum splits over chunks of tokens (and over data-parallel
    ranks, with `n_wrote` counted across them), so the backward can run chunk by chunk.

    count: [E] the role's tokens per episode; episode_of: [S] → [S].

    >>> token_weights(torch.tensor([1., 3.]), torch.tensor([0, 1, 1, 1]), 2).tolist()
    [0.5, 0.1666666716337204, 0.1666666716337204, 0.1666666716337204]
    """
    return 1.0 / (count[episode_of] * n_wrote)


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor, clip_eps: float) -> torch.Tensor:
    """PPO-clip objective per token (to maximise). All [S]; `advantage` already per token."""
    ratio = torch.exp(logp - old_logp)  # [S]
    return torch.minimum(ratio * advantage, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage)


def kl_to_reference(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy ‖ reference), the unbiased non-negative k3 estimator. [S] → [S]."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1


def grpo_role_loss(logp, old_logp, advantage, weight, clip_eps: float, ref_logp=None,
                   kl_coef: float = 0.0) -> dict[str, torch.Tensor]:
    """One role's loss over some of its tokens: −Σ weight · clipped surrogate, plus kl_coef ·
    Σ weight · KL to the reference (`token_weights` make the full sum per-episode means).

    logp, old_logp, ref_logp: [S] log-probs of the role's sampled tokens; advantage: [S], the
    token's episode's; weight: [S] → {"loss", "kl" (weighted, detached), "clipped" (count)}.
    """
    surrogate = clipped_surrogate(logp, old_logp, advantage, clip_eps)  # [S]
    loss = -(weight * surrogate).sum()
    kl = logp.new_zeros(())
    if ref_logp is not None:
        kl = (weight * kl_to_reference(logp, ref_logp)).sum()
        loss = loss + kl_coef * kl
    clipped = ((logp - old_logp).exp() - 1).abs() > clip_eps  # [S]
    return {"loss": loss, "kl": kl.detach(), "clipped": clipped.sum()}


def leak_mass(logits: torch.Tensor, leak_ids: torch.Tensor) -> torch.Tensor:
    """Persona-leak auxiliary loss: probability ACT puts on response-only tokens, per token.

    logits: [S, V] at ACT positions; leak_ids: [M] ids of the words seen only in tool
    responses that are one token each (see `roles.leak_words`) → [S].
    """
    return torch.softmax(logits.float(), dim=-1)[:, leak_ids].sum(-1)
