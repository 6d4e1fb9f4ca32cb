"""tandem's compact forward pass for the Llama family (Llama, Mistral, Qwen2).

RMSNorm, rotary embeddings, grouped-query attention, SwiGLU. q/k/v and gate/up projections are
fused into one Linear each so a decode step runs 4 matmuls per layer; the optimizers in
tandem.optimize swap these Linear modules (int8, ...) without touching this file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem.kernels import DECODE_MAX_TOKENS, DecodePlan, rms_norm, rope_and_cache, silu_mul, varlen_attention
from tandem.model.config import ModelConfig
from tandem.model.forward_batch import CachedGroup, ForwardBatch, FreshGroup, VarlenGroup
from tandem.model.rope import apply_rope, rope_tables

__all__ = ["Transformer", "KVCache"]


class KVCache:
    """Preallocated keys and values, paged: per layer a [kv_heads, blocks, block_size, head_dim]
    tensor each, one pool of blocks shared by every sequence (their block tables say which blocks
    hold a sequence's positions). Head-major: a sequence's blocks, taken in order from the pool, are
    one contiguous stream per kv head, which decode attention reads at the memory's streaming speed
    (blocks outermost gave 4 KB runs 48 KB apart: 26% slower at 1536 keys on an AVX2 host)."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype) -> None:
        shape = (config.num_key_value_heads, num_blocks, block_size, config.head_dim)
        self.num_blocks, self.block_size = num_blocks, block_size
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

    def fused(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The C kernel (float32, inference): with residual, x += residual in place first."""
        return rms_norm(x, self.weight, self.eps, residual)


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
        batch: ForwardBatch | None,
    ) -> torch.Tensor:
        if batch is None:
            return self._forward_plain(x, cos, sin)
        n = x.shape[0]  # flat tokens of every row
        qkv = self.qkv_proj(x)
        q_dim, kv_dim, _ = self.split
        keys, values = cache.k[self.layer], cache.v[self.layer]
        v = qkv[:, q_dim + kv_dim :].view(n, self.kv_heads, self.head_dim)
        if batch.kernels and qkv.dtype == torch.float32:
            # One C pass: rotate q and k in place, store k and v in the cache.
            rope_and_cache(
                qkv,
                cos.view(n, -1),
                sin.view(n, -1),
                batch.write_offsets,
                batch.write_blocks,
                keys,
                values,
                self.heads,
            )
            q = qkv[:, :q_dim].view(n, self.heads, self.head_dim)
            k = qkv[:, q_dim : q_dim + kv_dim].view(n, self.kv_heads, self.head_dim)
        else:
            # q and k sit side by side in the fused output: rotate both in one pass.
            qk = apply_rope(qkv[:, : q_dim + kv_dim].view(n, self.heads + self.kv_heads, self.head_dim), cos, sin)
            q, k = qk[:, : self.heads], qk[:, self.heads :]
            # Adjacent advanced indices after the head dim: the indexed view is [kv_heads, N, head_dim].
            keys[:, batch.write_blocks, batch.write_offsets] = k.transpose(0, 1).to(keys.dtype)
            values[:, batch.write_blocks, batch.write_offsets] = v.transpose(0, 1).to(values.dtype)
        if len(batch.groups) == 1:
            out = self._attend(batch.groups[0], q, k, v, keys, values)
        else:
            out = q.new_empty((n, self.heads, self.head_dim))
            for group in batch.groups:
                lo, hi = group.lo, group.hi
                out[lo:hi] = self._attend(group, q[lo:hi], k[lo:hi], v[lo:hi], keys, values)
        return self.o_proj(out.reshape(n, self.heads * self.head_dim))

    def _forward_plain(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[B, T] rows from position 0, no cache: training, parity checks."""
        b, t, _ = x.shape
        qkv = self.qkv_proj(x)
        q_dim, kv_dim, _ = self.split
        qk = apply_rope(qkv[..., : q_dim + kv_dim].view(b, t, self.heads + self.kv_heads, self.head_dim), cos, sin)
        q, k = qk[:, :, : self.heads].transpose(1, 2), qk[:, :, self.heads :].transpose(1, 2)
        v = qkv[..., q_dim + kv_dim :].view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        gqa = self.heads != self.kv_heads
        if self.sliding_window is not None and t > self.sliding_window:
            pos = torch.arange(t)
            mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - self.sliding_window)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))

    def _attend(
        self,
        group: FreshGroup | CachedGroup | VarlenGroup,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        """One group's attention: q [T_group, heads, head_dim] -> [T_group, heads, head_dim]."""
        if isinstance(group, VarlenGroup):
            return varlen_attention(
                q, keys, values, group.offsets, group.lengths, group.tables, group.starts, self.sliding_window
            )
        gqa = self.heads != self.kv_heads
        if isinstance(group, FreshGroup):
            q, k, v = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
            if group.mask is not None:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=group.mask, enable_gqa=gqa)
            else:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            return out[0].transpose(0, 1)
        rows, t = group.num_rows, group.num_new
        kv, group_size = self.kv_heads, self.heads // self.kv_heads
        # Each row's blocks gathered into [rows, kv_heads, key_len, head_dim]: one index_select
        # copies whole blocks per kv head (advanced indexing copied element by element, 6x slower),
        # and the head-major cache needs no second copy to bring a row's blocks together.
        width, block_size = group.tables.shape[1], keys.shape[2]
        flat = group.tables.view(-1)
        keys, values = (
            cache.index_select(1, flat).view(kv, rows, width * block_size, -1).transpose(0, 1)[:, :, : group.key_len]
            for cache in (keys, values)
        )
        # Stack the query heads that share a kv head (and their T positions) as that kv head's
        # queries: attention runs per kv head, with no expansion of keys and values (GQA for free).
        q = q.view(rows, t, kv, group_size, self.head_dim).permute(0, 2, 3, 1, 4).reshape(rows, kv, -1, self.head_dim)
        dtype = q.dtype
        if keys.dtype != dtype:  # a KV cache stored narrower than the activations (kv-bf16)
            q = q.to(keys.dtype)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=group.mask).to(dtype)
        return out.view(rows, kv, group_size, t, self.head_dim).permute(0, 3, 1, 2, 4).reshape(rows * t, self.heads, -1)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if fused and gate_up.dtype == torch.float32:
            return self.down_proj(silu_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, cache, batch):
        if batch is not None and batch.kernels and x.dtype == torch.float32:
            # Fused: the attention output becomes the residual stream (x added in place) as it is normed.
            attn = self.self_attn(self.input_layernorm.fused(x), cos, sin, cache, batch)
            hidden = self.post_attention_layernorm.fused(attn, residual=x)
            return self.mlp(hidden, fused=True).add_(attn)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


def _embedding(vocab_size: int, hidden_size: int) -> nn.Embedding:
    """nn.Embedding, randomly initialised except on the meta device (Transformer.empty), where there
    is nothing to initialise and nn.init.normal_ would import torch._dynamo (1.5 s in every process
    that loads a model)."""
    if torch.get_default_device().type == "meta":
        return nn.Embedding(vocab_size, hidden_size, _weight=torch.empty(vocab_size, hidden_size))
    return nn.Embedding(vocab_size, hidden_size)


class Transformer(nn.Module):
    """Decoder-only transformer. `forward` returns final hidden states; `logits` applies the head."""

    def __init__(self, config: ModelConfig, max_positions: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = _embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(config, max_positions or config.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._decode_plan: tuple[KVCache, DecodePlan | None] | None = None

    @classmethod
    def empty(cls, config: ModelConfig, dtype: torch.dtype, max_positions: int | None = None) -> Transformer:
        """A model with uninitialised weights (to be loaded), skipping the costly random init."""
        with torch.device("meta"):
            module = cls(config, max_positions)  # the rope tables are computed on the CPU even here
        # Each parameter made an uninitialised CPU tensor of the served dtype. (nn.Module.to_empty runs
        # torch's Python reference of empty_like on meta tensors, which imports sympy and torch.fx:
        # 0.5 s in every process that loads a model.)
        for sub in module.modules():
            for name, param in list(sub.named_parameters(recurse=False)):
                setattr(sub, name, nn.Parameter(torch.empty(param.shape, dtype=dtype), requires_grad=False))
        if config.tie_word_embeddings:
            module.lm_head.weight = module.embed_tokens.weight
        return module

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def ensure_positions(self, count: int) -> None:
        """Rotary tables for at least `count` positions (loaded for the served context only; grown here)."""
        if self.rope_cos.shape[0] < count:
            self.rope_cos, self.rope_sin = rope_tables(self.config, count)

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        batch: ForwardBatch | None = None,
    ) -> torch.Tensor:
        """Without a batch: tokens [B, T] from position 0, no cache -> hidden [B, T, hidden].
        With a ForwardBatch and its cache: the batch's flat tokens -> hidden [N, hidden]."""
        if batch is None:
            positions = torch.arange(tokens.shape[1])[None, :].expand(tokens.shape[0], -1)
        else:
            if cache is None:
                raise ValueError("a ForwardBatch reads and writes a KV cache; pass one")
            tokens, positions = batch.tokens, batch.positions
            plan = self._fused_decoder(cache, batch)
            if plan is not None:
                # Every layer in one C call: decode steps are too small to pay per-op dispatch.
                x = self.embed_tokens(tokens)
                plan.run(x, self.rope_cos[positions], self.rope_sin[positions], batch)
                return self.norm.fused(x)
        x = self.embed_tokens(tokens)
        cos = self.rope_cos[positions].to(x.dtype).unsqueeze(-2)
        sin = self.rope_sin[positions].to(x.dtype).unsqueeze(-2)
        for layer in self.layers:
            x = layer(x, cos, sin, cache, batch)
        if batch is not None and batch.kernels and x.dtype == torch.float32:
            return self.norm.fused(x)
        return self.norm(x)

    def _fused_decoder(self, cache: KVCache, batch: ForwardBatch) -> DecodePlan | None:
        """The fused decoder for this cache when it serves this step (kernels on, decode rows only,
        at most DECODE_MAX_TOKENS tokens, every layer's Linears packed for the kernels)."""
        if not (batch.kernels and batch.decode_only and len(batch.tokens) <= DECODE_MAX_TOKENS):
            return None
        if self.dtype != torch.float32:
            return None
        if self._decode_plan is None or self._decode_plan[0] is not cache:
            self._decode_plan = (cache, DecodePlan.build(list(self.layers), self.config, cache.k, cache.v))
        return self._decode_plan[1]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
