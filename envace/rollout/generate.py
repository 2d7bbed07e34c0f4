"""Batched sampling with a KV cache: left padding, per-sequence stop, temperature / top-p.

Every sequence in the batch is prefilled once, then decoded one token per step with the
model's KV cache; a sequence that produced the stop token (or reached its budget) is done
and the batch shrinks to the live rows, so long stragglers do not pay for finished ones.
"""

from __future__ import annotations

import inspect

import torch


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator=None) -> torch.Tensor:
    """logits [B, V] → token ids [B]; temperature 0 is greedy."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the most likely token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    if generator is not None and generator.device != probs.device:  # a CPU generator drives GPU sampling too
        return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def cache_kwarg(model) -> str:
    """The forward keyword for the KV cache: `cache` since transformers 5.2x, `past_key_values`
    before; a model that silently swallows the wrong one decodes every token without context."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def generate(
    model, prompts: list[list[int]], max_new_tokens: int, stop_id: int, pad_id: int,
    temperature: float = 0.0, top_p: float = 1.0, generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Continue each prompt; returns the new tokens of each (the stop token included if produced)."""
    from transformers import DynamicCache

    if not prompts:
        return []
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, P), pad_id, dtype=torch.long)
    mask = torch.zeros((B, P), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding: every prompt ends at column P-1
        ids[i, P - len(p):] = torch.tensor(p)
        mask[i, P - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
    cache = DynamicCache(config=model.config)
    with_cache = {cache_kwarg(model): cache, "use_cache": True}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, **with_cache, logits_to_keep=1)
    outputs: list[list[int]] = [[] for _ in range(B)]
    live = torch.arange(B, device=device)  # rows of the original batch still decoding
    next_pos = positions[:, -1:] + 1  # [B, 1]
    logits = out.logits[:, -1]  # [B, V]
    for _ in range(max_new_tokens):
        token = sample_next(logits, temperature, top_p, generator)  # [L]
        for row, t in zip(live.tolist(), token.tolist()):
            outputs[row].append(t)
        still = token != stop_id  # [L]
        if len(outputs[live[0].item()]) >= max_new_tokens or not still.any():
            break
        if not still.all():  # drop finished rows from the batch and the cache
            keep = still.nonzero().squeeze(-1)
            live, token, mask, next_pos = live[keep], token[keep], mask[keep], next_pos[keep]
            cache.batch_select_indices(keep)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=next_pos, **with_cache)
        next_pos = next_pos + 1
        logits = out.logits[:, -1]
    return outputs
