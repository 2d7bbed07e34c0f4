"""Batched sampling with a KV cache: left padding, per-sequence stop, temperature / top-p.

Every sequence in the batch is prefilled once, then decoded one token per step with a KV
cache — the lean decoder of `envace.rollout.lean` wherever the model allows it (Llama models
in float32 on the CPU: the same tokens up to float rounding, decode steps ~1.5-1.9x faster),
else the model's own forward with transformers' cache. A sequence that produced the stop
token (or reached its budget) is done and the batch shrinks to the live rows, so long stragglers do not pay for finished ones.

Randomness is per row, not per batch: row i's t-th token is drawn by inverse-CDF sampling
with the uniform `uniforms(stream[i], t)`, a counter-based hash (splitmix64) of the row's
stream key and t. So what a sequence samples depends only on its own stream key, never on
which other sequences share its batch — data-parallel ranks that split the rollouts sample
exactly what one process would, and rebatching changes nothing.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def mix64(*parts: int) -> int:
    """A 64-bit key from integers (splitmix64 over each in turn): stream keys for episodes,
    generations and draws. Deterministic across processes and machines."""
    x = 0
    for part in parts:
        x = (x ^ (part & _MASK)) + _GOLDEN & _MASK
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
        x ^= x >> 31
    return x


def unit(*parts: int) -> float:
    """A uniform number in [0, 1) determined by `parts`.

    >>> unit(1, 2) == unit(1, 2) != unit(2, 1)
    True
    """
    return (mix64(*parts) >> 11) * 2.0**-53


def uniforms(streams: np.ndarray, t: int) -> np.ndarray:
    """One uniform in [0, 1) per stream key for draw number t. streams: [L] uint64 → [L] float64."""
    with np.errstate(over="ignore"):
        x = (streams ^ np.uint64(t)) + np.uint64(_GOLDEN)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] → token ids [B]; temperature 0 is greedy, else `u` [B] (uniforms in
    [0, 1)) picks each row's token by inverse CDF."""
    if temperature <= 0:  # the first of tied maxima, as argmax; max's kernel is ~3x faster on the CPU
        return logits.max(-1).indices
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the most likely token
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    cdf = probs.cumsum(-1)  # [B, V]
    target = u.to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]  # [B, 1]
    return torch.searchsorted(cdf, target).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, mask, positions [B, P]: every prompt ends at column P-1, its positions counted from 0.

    >>> [t.tolist() for t in left_padded([[5, 6], [7]], 0)]
    [[[5, 6], [0, 7]], [[1, 1], [0, 1]], [[0, 1], [0, 0]]]
    """
    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, P), pad_id, dtype=torch.long)
    mask = torch.zeros((B, P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p):] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def survivors(still: torch.Tensor) -> torch.Tensor:
    """The live rows' indices [n] for a mask `still` [L]: a row that stays in the first n keeps
    its place and the live rows beyond fill the finished rows' places, so dropping k finished
    rows moves at most k rows of the KV cache (keeping the order would move every row after the
    first finished one).

    >>> survivors(torch.tensor([True, False, True, False, True, True])).tolist()
    [0, 4, 2, 5]
    """
    n = int(still.sum())
    order = torch.arange(n, device=still.device)
    holes = (~still[:n]).nonzero().squeeze(-1)
    order[holes] = still[n:].nonzero().squeeze(-1) + n
    return order


def cache_kwarg(model) -> str:
    """The forward keyword for the KV cache: `cache` since transformers 5.2x, `past_key_values`
    before; a model that silently swallows the wrong one decodes every token without context.
    A PEFT wrapper takes **kwargs: its base model's forward decides."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class CachedForward:
    """The model's own forward with transformers' dynamic KV cache (any model, any device)."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model, self.cache = model, DynamicCache(config=model.config)
        self.with_cache = {cache_kwarg(model): self.cache, "use_cache": True}

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.mask = mask
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **self.with_cache, logits_to_keep=1)
        return out.logits[:, -1]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=-1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=positions[:, None], **self.with_cache)
        return out.logits[:, -1]

    def keep(self, rows: torch.Tensor) -> None:
        self.mask = self.mask[rows]
        self.cache.batch_select_indices(rows)


def decoder_for(model, batch: int, columns: int, lean: bool | None = None):
    """The lean decoder (`lean=True`; None: wherever the model allows it) or the model's own
    forward (`lean=False`, or a model lean decoding does not take)."""
    from envace.rollout import lean as lean_decoding

    supported = lean_decoding.supports(model)
    if lean is False or (lean is None and not supported):
        return CachedForward(model)
    if not supported:
        raise ValueError(f"lean decoding needs a plain Llama model in float32 on the CPU, not {type(model).__name__} "
                         f"({next(model.parameters()).dtype} on {next(model.parameters()).device})")
    return lean_decoding.LeanDecoder(model, batch, columns)


@torch.no_grad()
def generate(
    model, prompts: list[list[int]], max_new_tokens: int, stop_id: int, pad_id: int,
    temperature: float = 0.0, top_p: float = 1.0, streams: list[int] | None = None, lean: bool | None = None,
) -> list[list[int]]:
    """Continue each prompt; returns the new tokens of each (the stop token included if produced).
    Sampling (temperature > 0) needs one stream key per prompt (`mix64`). `lean`: decode with
    `envace.rollout.lean` (None: wherever the model allows it; True: a ValueError names a model
    it does not take; False: the model's forward)."""
    if not prompts:
        return []
    if temperature > 0 and (streams is None or len(streams) != len(prompts)):
        raise ValueError("sampling needs one stream key per prompt")
    device = next(model.parameters()).device
    ids, mask, positions = (t.to(device) for t in left_padded(prompts, pad_id))
    B, P = ids.shape
    keys = np.array(streams if temperature > 0 else [0] * B, dtype=np.uint64)
    decoder = decoder_for(model, B, P + max_new_tokens, lean)
    logits = decoder.prefill(ids, mask, positions)  # [B, V]
    outputs: list[list[int]] = [[] for _ in range(B)]
    live = torch.arange(B, device=device)  # rows of the original batch still decoding
    next_pos = positions[:, -1] + 1  # [B]
    for t in range(max_new_tokens):
        u = torch.from_numpy(uniforms(keys[live.cpu().numpy()], t)) if temperature > 0 else None
        token = sample_next(logits, temperature, top_p, u)  # [L]
        for row, tok in zip(live.tolist(), token.tolist()):
            outputs[row].append(tok)
        still = token != stop_id  # [L]
        if len(outputs[live[0].item()]) >= max_new_tokens or not still.any():
            break
        if not still.all():  # drop finished rows from the batch and the cache
            keep = survivors(still)
            live, token, next_pos = live[keep], token[keep], next_pos[keep]
            decoder.keep(keep)
        logits = decoder.step(token, next_pos)
        next_pos = next_pos + 1
    return outputs
