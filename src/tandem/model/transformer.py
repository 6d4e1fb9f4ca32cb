"""tandem's compact forward pass for the Llama family (Llama, Mistral, Qwen2).

RMSNorm, rotary embeddings, grouped-query attention, SwiGLU. q/k/v and gate/up projections are
fused into one Linear each so a decode step runs 4 matmuls per layer; the optimizers in
tandem.optimize swap these Linear modules (int8, ...) without touching this file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem.model.attention_batch import AttentionBatch
from tandem.model.config import ModelConfig
from tandem.model.rope import apply_rope, rope_tables

__all__ = ["Transformer", "KVCache"]


class KVCache:
    """Preallocated keys and values: per layer a [slots, kv_heads, max_len, head_dim] tensor each."""

    def __init__(self, config: ModelConfig, num_slots: int, max_len: int, dtype: torch.dtype) -> None:
        shape = (num_slots, config.num_key_value_heads, max_len, config.head_dim)
        self.num_slots, self.max_len = num_slots, max_len
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused kernel instead of six elementwise ops
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Lower precision: normalise in float32 like Hugging Face, then scale in the model's dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.split = (q_dim, kv_dim, kv_dim)
        self.qkv_proj = nn.Linear(config.hidden_size, q_dim + 2 * kv_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.o_bias)
        self.sliding_window = config.sliding_window

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None,
        batch: AttentionBatch | None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self.qkv_proj(x)
        q_dim, kv_dim, _ = self.split
        # q and k sit side by side in the fused output: rotate both in one pass.
        qk = apply_rope(qkv[..., : q_dim + kv_dim].view(b, t, self.heads + self.kv_heads, self.head_dim), cos, sin)
        q, k = qk[:, :, : self.heads], qk[:, :, self.heads :]
        v = qkv[..., q_dim + kv_dim :].view(b, t, self.kv_heads, self.head_dim)
        gqa = self.heads != self.kv_heads
        if cache is None or batch is None or batch.fresh_causal:
            if cache is not None and batch is not None:
                self._write(cache, batch, k, v)
            out = self._attend_fresh(q, k, v, gqa)
        else:
            self._write(cache, batch, k, v)
            out = self._attend_cached(q, cache, batch, gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))

    def _write(self, cache: KVCache, batch: AttentionBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        slot_idx = batch.slots[:, None].expand_as(batch.positions)
        # Advanced indices around a slice: the indexed view is [B, T, kv_heads, head_dim], k's layout.
        cache.k[self.layer][slot_idx, :, batch.positions] = k.to(cache.k[self.layer].dtype)
        cache.v[self.layer][slot_idx, :, batch.positions] = v.to(cache.v[self.layer].dtype)

    def _attend_fresh(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        t = q.shape[2]
        if self.sliding_window is not None and t > self.sliding_window:
            pos = torch.arange(t)
            mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - self.sliding_window)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=gqa)

    def _attend_cached(self, q: torch.Tensor, cache: KVCache, batch: AttentionBatch, gqa: bool) -> torch.Tensor:
        lo, hi, kl = batch.slot_lo, batch.slot_hi, batch.key_len
        keys = cache.k[self.layer][lo:hi, :, :kl]
        values = cache.v[self.layer][lo:hi, :, :kl]
        q = q.transpose(1, 2)  # [B, heads, T, head_dim]
        if batch.rows is not None:
            full = q.new_zeros((hi - lo, *q.shape[1:]))
            full[batch.rows] = q
            q = full
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=batch.mask, enable_gqa=gqa)
        return out if batch.rows is None else out[batch.rows]


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, cache, batch):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Decoder-only transformer. `forward` returns final hidden states; `logits` applies the head."""

    def __init__(self, config: ModelConfig, max_positions: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(config, max_positions or config.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @classmethod
    def empty(cls, config: ModelConfig, dtype: torch.dtype, max_positions: int | None = None) -> Transformer:
        """A model with uninitialised weights (to be loaded), skipping the costly random init."""
        with torch.device("meta"):
            module = cls(config, max_positions)
        module = module.to_empty(device="cpu").to(dtype)
        if config.tie_word_embeddings:
            module.lm_head.weight = module.embed_tokens.weight
        # to_empty leaves buffers uninitialised; the rope tables stay float32 whatever the weights.
        module.rope_cos, module.rope_sin = rope_tables(config, max_positions or config.max_position_embeddings)
        return module

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        batch: AttentionBatch | None = None,
    ) -> torch.Tensor:
        """tokens [B, T] -> hidden [B, T, hidden]. Without a cache: plain causal from position 0."""
        if batch is None:
            positions = torch.arange(tokens.shape[1])[None, :].expand(tokens.shape[0], -1)
        else:
            positions = batch.positions
        x = self.embed_tokens(tokens)
        cos = self.rope_cos[positions].to(x.dtype)[:, :, None, :]
        sin = self.rope_sin[positions].to(x.dtype)[:, :, None, :]
        for layer in self.layers:
            x = layer(x, cos, sin, cache, batch)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
