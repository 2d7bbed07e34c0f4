"""The losses, in one file. Shapes: B sequences, T tokens, H hidden, N selected targets.

`role_nll` computes next-token NLL only at positions whose next token a role generated
(logits for the other positions are never materialised: the LM head is a large share of
a small model's compute). Prompt, tool and padding tokens carry role 0 and are never
trained.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from envace.roles import ROLE_IDS

ACT_ID, REHEARSE_ID = ROLE_IDS["act"], ROLE_IDS["rehearse"]


def role_nll(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, roles: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean next-token NLL of the ACT targets and of the REHEARSE targets.

    input_ids, attention_mask, roles: [B, T]; roles[b, t] is the role that wrote token t.
    """
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
    target_roles = roles[:, 1:]  # [B, T-1]: who wrote the token being predicted
    selected = target_roles > 0  # [B, T-1]
    h = hidden[:, :-1][selected]  # [N, H]
    targets = input_ids[:, 1:][selected]  # [N]
    who = target_roles[selected]  # [N]
    nll = F.cross_entropy(model.get_output_embeddings()(h).float(), targets, reduction="none")  # [N]
    out = {}
    for name, rid in (("act", ACT_ID), ("rehearse", REHEARSE_ID)):
        mine = who == rid
        out[name] = nll[mine].mean() if mine.any() else nll.sum() * 0.0
        out[f"{name}_tokens"] = mine.sum()
    return out


def warmup_loss(model, batch: dict, lambda_env: float) -> dict[str, torch.Tensor]:
    """SFT on both roles: L = L_act + lambda_env * L_rehearse."""
    parts = role_nll(model, batch["input_ids"], batch["attention_mask"], batch["roles"])
    parts["loss"] = parts["act"] + lambda_env * parts["rehearse"]
    return parts
