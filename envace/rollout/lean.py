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
(less padding; a group's activations stay in the CPU's cache). A beginning that prompts of
one batch share is prefilled once and copied: the tool list of a domain, the task a GRPO
group plays eight times, the conversation its episodes had in common (38% of evaluation's
prompt tokens, 52% of private rehearsal's, 71% of a GRPO step's). Results equal the model's
forward up to float rounding (`tests/test_rollout.py` checks logits, the cache and the tokens
generated).

Training reads the same arithmetic through `target_states`: the model's forward for
right-padded rows, less what no loss reads — in the last layer, queries, attention, output
projection and MLP run only where a target is predicted from (about a quarter of warmup's
positions), keys and values everywhere.

Shapes: B rows, P prompt columns, H query heads, G key/value heads, D head size, E hidden
size, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from envace.rollout.generate import left_padded

PREFILL_ROWS = 32  # rows prefilled together (`LeanDecoder.prefill`)
SHARED_LEAST = 16  # the shortest beginning that prompts share which is prefilled once for all


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


def shared_prefixes(prompts: list[list[int]], least: int = SHARED_LEAST) -> list[tuple[list[int], int]]:
    """Groups of two or more prompts that begin with the same `n` tokens, `least` or more (and
    each prompt longer than `n`: its last column is always computed), as [(rows, n)]: chosen
    among runs of the prompts sorted, to spare the most tokens, (rows - 1) * n summed.

    >>> shared_prefixes([[1, 2, 3, 9], [7, 7], [1, 2, 3, 4, 5], [1, 2, 8]], least=2)
    [([2, 0, 3], 2)]
    >>> shared_prefixes([[1, 2, 3, 9], [1, 2, 3, 4, 5], [1, 2, 8]], least=3)
    [([1, 0], 3)]
    """
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    # common[k]: what sorted prompt k shares with the one before, short of either's last token
    common = [0] + [min(_common(prompts[a], prompts[b]), len(prompts[a]) - 1, len(prompts[b]) - 1)
                    for a, b in zip(order, order[1:])]
    spared, start = [0] * (len(order) + 1), list(range(len(order) + 1))  # over the first j sorted prompts
    for j in range(1, len(order) + 1):
        spared[j], start[j], n = spared[j - 1], j - 1, len(prompts[order[j - 1]])
        for i in range(j - 1, 0, -1):  # sorted prompts i-1 .. j-1 as one group
            n = min(n, common[i])
            if n < least:
                break
            if spared[i - 1] + (j - i) * n > spared[j]:
                spared[j], start[j] = spared[i - 1] + (j - i) * n, i - 1
    groups, j = [], len(order)
    while j > 0:
        i = start[j]
        if j - i > 1:
            groups.append(([order[k] for k in range(i, j)], min(common[i + 1:j])))
        j = i
    return groups[::-1]


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def target_states(model, input_ids: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Right-padded rows input_ids [B, T] and selected [B, T] (the positions a target is
    predicted from) → the final hidden states at the selected positions, row by row [N, E];
    differentiable, for training. The model's forward up to float rounding (tested), less the
    last layer's work at the positions nothing reads: there a position only gives its key and
    value to the ones after it. No mask: under causal attention a real token never sees a pad
    after it."""
    inner, cfg = model.model, model.config
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    B, T = input_ids.shape
    x = inner.embed_tokens(input_ids)  # [B, T, E]
    cos, sin = (c[:, None] for c in inner.rotary_emb(x, torch.arange(T, device=x.device)[None]))  # [1, 1, T, D]
    last = len(inner.layers) - 1
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        h = _rms(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
        k = _rotate(F.linear(h, attn.k_proj.weight).view(B, T, G, D).transpose(1, 2), cos, sin)  # [B, G, T, D]
        v = F.linear(h, attn.v_proj.weight).view(B, T, G, D).transpose(1, 2)
        allowed, causal = None, True
        if i == last:  # from here on only the selected positions: Q of them a row, padded
            Q = int(selected.sum(-1).max())
            at = torch.where(selected, torch.arange(T, device=x.device), T).sort(-1).values[:, :Q]  # [B, Q]
            real, at = at < T, at.clamp(max=T - 1)  # a pad query reads the last column, then is dropped
            x, h = (t.gather(1, at[..., None].expand(-1, -1, t.shape[-1])) for t in (x, h))  # [B, Q, E]
            cos, sin = cos[0, 0][at][:, None], sin[0, 0][at][:, None]  # [B, 1, Q, D]
            allowed, causal = (torch.arange(T, device=x.device) <= at[..., None])[:, None], False  # [B, 1, Q, T]
        n = x.shape[1]
        q = _rotate(F.linear(h, attn.q_proj.weight).view(B, n, H, D).transpose(1, 2), cos, sin)  # [B, H, n, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=causal, enable_gqa=G != H)
        x = x + F.linear(out.transpose(1, 2).reshape(B, n, H * D), attn.o_proj.weight)
        h = _rms(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
        x = x + _swiglu(h, mlp)
    return _rms(x[real], inner.norm.weight, cfg.rms_norm_eps)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic, bit for bit (tested), in one operator where it took five."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _swiglu(h: torch.Tensor, mlp) -> torch.Tensor:
    """The MLP from the module's own weights: down(silu(gate(h)) * up(h))."""
    return F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight), mlp.down_proj.weight)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embeddings, Llama's pairing (each half of a head with the other)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


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
        return _rms(x, weight, self.eps)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [...] → cos, sin [..., D] (one angle set for every head)."""
        freqs = positions[..., None].float() * self.inv_freq  # [..., D/2]
        angles = torch.cat((freqs, freqs), -1)
        return angles.cos() * self.rope_scale, angles.sin() * self.rope_scale

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

        A beginning that several prompts share (a tool list, a task the whole GRPO group
        plays) is prefilled once, then copied to each (`_share_prefixes`). What is left of each
        prompt goes through in groups of `PREFILL_ROWS` rows sorted by that length, each group
        cut to its longest: less padding to compute, and a group's activations stay in the
        CPU's cache. A row's cache columns left of its group's width stay zero, masked like pads."""
        B, P = ids.shape
        lengths = mask.sum(-1)
        fresh = lengths - self._share_prefixes(ids, lengths)  # columns left to compute, per row
        logits = torch.empty(B, self.head.shape[0], dtype=self.head.dtype)
        for rows in fresh.argsort(stable=True).split(PREFILL_ROWS):
            width = max(int(lengths[rows].max()), 1)
            cut = slice(P - width, P)
            logits[rows] = self._prefill_rows(rows, ids[rows, cut], mask[rows, cut], positions[rows, cut], cut,
                                              max(int(fresh[rows].max()), 1))
        self.bias[:B, :, :, :P] = torch.where(mask.bool(), 0.0, float("-inf"))[:, None, None]
        self.filled = P
        return logits

    def _share_prefixes(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Prefill each shared beginning (`shared_prefixes`) once, by a decoder of its own (which
        shares in turn what the beginnings share), and copy its keys and values into the
        columns of every prompt that begins so → per row, how many of its columns are in the
        cache [B]."""
        B, P = ids.shape
        prompts = [row[P - n:] for row, n in zip(ids.tolist(), lengths.tolist())]
        shared = torch.zeros(B, dtype=torch.long)
        groups = shared_prefixes(prompts)
        if not groups:
            return shared
        beginnings = [prompts[rows[0]][:n] for rows, n in groups]
        width = max(map(len, beginnings))
        once = LeanDecoder(self.model, len(groups), width)
        once.prefill(*left_padded(beginnings, 0))
        # one (row, column) <- (group, column of `once`) pair per token copied
        members = torch.tensor([r for rows, _ in groups for r in rows])
        group = torch.tensor([g for g, (rows, _) in enumerate(groups) for _ in rows])
        shared[members] = torch.tensor([n for rows, n in groups for _ in rows])
        n = shared[members]
        offset = torch.arange(int(n.sum())) - (n.cumsum(0) - n).repeat_interleave(n)  # 0 .. n-1 per member
        row, group = members.repeat_interleave(n), group.repeat_interleave(n)
        column = (P - lengths[members]).repeat_interleave(n) + offset
        source = (width - n).repeat_interleave(n) + offset
        self.keys[:, row, :, :, column] = once.keys[:, group, :, :, source]
        self.values[:, row, :, column] = once.values[:, group, :, source]
        return shared

    def _prefill_rows(self, rows: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                      columns: slice, fresh: int) -> torch.Tensor:
        """`prefill` for one group: ids, mask, positions [B, P] (here the group's rows and its
        P columns, at `columns` of the cache's `rows`), of which the last `fresh` are computed
        here and the ones before are read from the cache → logits at the last column [B, V]."""
        B, P = ids.shape
        old = P - fresh
        cos, sin = (c[:, None] for c in self._rope(positions[:, old:]))  # [B, 1, F, D]
        # causal, and never at a pad key; a pad column also sees itself, so no row of the
        # softmax is empty (torch 2.13's SDPA returns zeros for one, but older versions and
        # other backends give NaN, and NaN times a zero weight is still NaN)
        allowed = torch.ones(fresh, P, dtype=torch.bool).tril(old) & mask.bool()[:, None, None, :]  # [B, 1, F, P]
        allowed[..., old:] |= torch.eye(fresh, dtype=torch.bool)
        written = slice(columns.stop - fresh, columns.stop)
        before = slice(columns.start, columns.stop - fresh)
        x = self.embed[ids[:, old:]]  # [B, F, E]
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = self._rms(x, layer.input_layernorm.weight)
            k = _rotate(F.linear(h, attn.k_proj.weight).view(B, fresh, self.G, self.D).transpose(1, 2), cos, sin)
            v = F.linear(h, attn.v_proj.weight).view(B, fresh, self.G, self.D).transpose(1, 2)  # [B, G, F, D]
            self.keys[i, rows, :, :, written] = k.transpose(-1, -2)
            self.values[i, rows, :, written] = v
            if old:  # the columns before: a shared beginning already in the cache, or pads
                k = torch.cat((self.keys[i, rows, :, :, before].transpose(-1, -2), k), 2)  # [B, G, P, D]
                v = torch.cat((self.values[i, rows, :, before], v), 2)
            if i == last:  # only the last column's output is read from here on
                x, h, allowed = x[:, -1:], h[:, -1:], allowed[:, :, -1:]
                cos, sin = cos[:, :, -1:], sin[:, :, -1:]
            Q = x.shape[1]
            q = _rotate(F.linear(h, attn.q_proj.weight).view(B, Q, self.H, self.D).transpose(1, 2), cos, sin)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=self.G != self.H)  # [B, H, Q, D]
            x = x + F.linear(out.transpose(1, 2).reshape(B, Q, self.H * self.D), attn.o_proj.weight)
            h = self._rms(x, layer.post_attention_layernorm.weight)
            x = x + _swiglu(h, mlp)
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
            q = _rotate(F.linear(h, attn.q_proj.weight).view(B, self.H, self.D), cos, sin)
            self.keys[i, :B, :, :, column] = _rotate(F.linear(h, attn.k_proj.weight).view(B, self.G, self.D), cos, sin)
            self.values[i, :B, :, column] = F.linear(h, attn.v_proj.weight).view(B, self.G, self.D)
            x = x + F.linear(self._attend(q, i, bias), attn.o_proj.weight)
            h = self._rms(x, layer.post_attention_layernorm.weight)
            x = x + _swiglu(h, mlp)
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
