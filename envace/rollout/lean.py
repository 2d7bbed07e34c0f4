"""A lean decoder for Llama-architecture models (the embedded default, SmolLM2): the decode
step written out over a static KV cache, for `generate` on the CPU.

Why: a decode step of a small model is a few microseconds of arithmetic per row; through
transformers' module stack (cache objects, mask building, hooks, one small kernel per
projection) it pays a fixed cost per step that dominates. A decode step here is the same
arithmetic — RMSNorm, rotary embeddings, grouped-query attention, SwiGLU — read from the
model's own parameters (so it always decodes the weights training just updated), with keys
stored transposed in a preallocated cache so attention is two plain matmuls. The prefill is
written out too, for what it can skip: of the last layer only the keys and values enter the
cache, so its queries, attention, output projection and MLP run for the last column alone
(about 40% of a 2-layer model's prefill arithmetic), keys and values go straight into the
static cache, and rows are prefilled in length-sorted groups, each cut to its longest prompt
(less padding; a group's activations stay in the CPU's cache). Results equal the model's
forward up to float rounding (`tests/test_rollout.py` checks logits and the tokens generated).

Shapes: B rows, P prompt columns, H query heads, G key/value heads, D head size, E hidden
size, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

PREFILL_ROWS = 32  # rows prefilled together (`LeanDecoder.prefill`)


def supports(model) -> bool:
    """A plain Llama-architecture model (no adapters, default or precomputed rope scaling,
    no biases, SiLU gates) on the CPU in float32."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "llama" or type(model).__name__ != "LlamaForCausalLM":
        return False
    rope = getattr(cfg, "rope_scaling", None) or {}
    param = next(model.parameters())
    return (param.device.type == "cpu" and param.dtype == torch.float32 and not getattr(cfg, "attention_bias", False)
            and not getattr(cfg, "mlp_bias", False) and cfg.hidden_act == "silu"
            and rope.get("rope_type", rope.get("type", "default")) in ("default", "llama3", "linear")
            and not torch.is_autocast_enabled("cpu"))


class LeanDecoder:
    """Prefill once, then one token per row per `step`; `keep` drops finished rows."""

    def __init__(self, model, batch: int, columns: int):
        cfg, inner = model.config, model.model
        self.model = model
        self.layers, self.norm, self.embed = inner.layers, inner.norm, inner.embed_tokens.weight
        self.head = model.lm_head.weight
        self.H, self.G = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.eps = cfg.rms_norm_eps
        self.inv_freq, self.rope_scale = inner.rotary_emb.inv_freq.float(), inner.rotary_emb.attention_scaling
        n, dtype = len(self.layers), self.embed.dtype
        self.keys = torch.zeros(n, batch, self.G, self.D, columns, dtype=dtype)  # transposed: q @ k is a plain matmul
        self.values = torch.zeros(n, batch, self.G, columns, self.D, dtype=dtype)
        self.bias = torch.full((batch, 1, 1, columns), float("-inf"), dtype=dtype)  # 0 where a row may look
        self.filled = 0  # columns written

    # -- the model's arithmetic ------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [...] → cos, sin [..., D] (one angle set for every head)."""
        freqs = positions[..., None].float() * self.inv_freq  # [..., D/2]
        angles = torch.cat((freqs, freqs), -1)
        return angles.cos() * self.rope_scale, angles.sin() * self.rope_scale

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    def _attend(self, q: torch.Tensor, layer: int, bias: torch.Tensor) -> torch.Tensor:
        """One new query per row against the cache's first `end` columns: q [B, H, D],
        bias [B, 1, 1, end] → [B, H * D]."""
        B, R, end = q.shape[0], self.H // self.G, bias.shape[-1]
        scores = q.view(B, self.G, R, self.D) @ self.keys[layer, :B, :, :, :end]  # [B, G, R, end]
        weights = torch.softmax(scores * (1 / math.sqrt(self.D)) + bias, -1)
        return (weights @ self.values[layer, :B, :, :end]).view(B, self.H * self.D)

    # -- the decoding interface --------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts ids, mask, positions [B, P] → logits at the last column [B, V];
        every layer's keys and values of the P columns written to the cache.

        Rows go through in groups of `PREFILL_ROWS` sorted by length, each group cut to its
        longest prompt: less padding to compute, and a group's activations stay in the CPU's
        cache. A row's cache columns left of its group's width stay zero, masked like pads."""
        B, P = ids.shape
        lengths = mask.sum(-1)
        logits = torch.empty(B, self.head.shape[0], dtype=self.head.dtype)
        for rows in lengths.argsort(stable=True).split(PREFILL_ROWS):
            width = max(int(lengths[rows].max()), 1)
            cut = slice(P - width, P)
            logits[rows] = self._prefill_rows(rows, ids[rows, cut], mask[rows, cut], positions[rows, cut], cut)
        self.bias[:B, :, :, :P] = torch.where(mask.bool(), 0.0, float("-inf"))[:, None, None]
        self.filled = P
        return logits

    def _prefill_rows(self, rows: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                      columns: slice) -> torch.Tensor:
        """`prefill` for one group: ids, mask, positions [B, P] (here the group's rows and its
        P columns), written to the cache's `rows` at `columns` → logits at the last column [B, V]."""
        B, P = ids.shape
        cos, sin = (c[:, None] for c in self._rope(positions))  # [B, 1, P, D]
        # causal, and never at a pad key; a pad column also sees itself, so no row of the
        # softmax is empty (torch 2.13's SDPA returns zeros for one, but older versions and
        # other backends give NaN, and NaN times a zero weight is still NaN)
        allowed = torch.ones(P, P, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]  # [B, 1, P, P]
        allowed |= torch.eye(P, dtype=torch.bool)
        x = self.embed[ids]  # [B, P, E]
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = self._rms(x, layer.input_layernorm.weight)
            k = self._rotate(F.linear(h, attn.k_proj.weight).view(B, P, self.G, self.D).transpose(1, 2), cos, sin)
            v = F.linear(h, attn.v_proj.weight).view(B, P, self.G, self.D).transpose(1, 2)  # [B, G, P, D]
            self.keys[i, rows, :, :, columns] = k.transpose(-1, -2)
            self.values[i, rows, :, columns] = v
            if i == last:  # only the last column's output is read from here on
                x, h, allowed = x[:, -1:], h[:, -1:], allowed[:, :, -1:]
                cos, sin = cos[:, :, -1:], sin[:, :, -1:]
            Q = x.shape[1]
            q = self._rotate(F.linear(h, attn.q_proj.weight).view(B, Q, self.H, self.D).transpose(1, 2), cos, sin)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=self.G != self.H)  # [B, H, Q, D]
            x = x + F.linear(out.transpose(1, 2).reshape(B, Q, self.H * self.D), attn.o_proj.weight)
            h = self._rms(x, layer.post_attention_layernorm.weight)
            x = x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight), mlp.down_proj.weight)
        return F.linear(self._rms(x[:, -1], self.norm.weight), self.head)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions [B] (one new token per live row) → logits [B, V]: the model's
        arithmetic for one token, its key and value written at the next cache column."""
        B, column = tokens.shape[0], self.filled
        self.bias[:B, :, :, column] = 0.0
        bias = self.bias[:B, :, :, : column + 1]
        cos, sin = (c[:, None] for c in self._rope(positions))  # [B, 1, D]
        x = self.embed[tokens]  # [B, E]
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = self._rms(x, layer.input_layernorm.weight)
            q = self._rotate(F.linear(h, attn.q_proj.weight).view(B, self.H, self.D), cos, sin)
            self.keys[i, :B, :, :, column] = self._rotate(F.linear(h, attn.k_proj.weight).view(B, self.G, self.D), cos, sin)
            self.values[i, :B, :, column] = F.linear(h, attn.v_proj.weight).view(B, self.G, self.D)
            x = x + F.linear(self._attend(q, i, bias), attn.o_proj.weight)
            h = self._rms(x, layer.post_attention_layernorm.weight)
            x = x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight), mlp.down_proj.weight)
        self.filled = column + 1
        return F.linear(self._rms(x, self.norm.weight), self.head)

    def keep(self, rows: torch.Tensor) -> None:
        """Only `rows` (indices into the live rows) decode on, row i of the cache becoming
        row rows[i]: only the rows that change place are copied, and only the columns written
        so far."""
        moved = (rows != torch.arange(rows.shape[0])).nonzero().squeeze(-1)
        source, filled = rows[moved], self.filled  # gathered before written: any order is safe
        self.keys[:, moved, :, :, :filled] = self.keys[:, source, :, :, :filled]
        self.values[:, moved, :, :filled] = self.values[:, source, :, :filled]
        self.bias[moved, :, :, :filled] = self.bias[source, :, :, :filled]
