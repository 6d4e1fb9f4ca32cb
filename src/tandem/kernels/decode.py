"""DecodePlan: every layer of a decode step in one C call (csrc/decode.c).

Built once per model and KV cache from the layers' packed quantized weights (int8, int4): a ctypes
description of each layer (weights, norms, cache) that the C side walks with its threads in one
parallel region. A model qualifies when every Linear inside its layers can describe itself
(`kernel_linear()`, the KernelLinear protocol) and its activations are float32; otherwise, and for
steps holding prompt tokens or more than DECODE_MAX_TOKENS tokens, the layer-by-layer path serves.
Both paths call the same C functions, so a token gets the same bits from either.
"""

from __future__ import annotations

import ctypes
import math
from typing import Protocol, runtime_checkable

import torch

from tandem.kernels.build import check_kv_cache, kernel_library
from tandem.kernels.quant_linear import FBGEMM_UNIT_INV, Int4Packed, Int8Packed

__all__ = ["DecodePlan", "KernelLinear", "DECODE_MAX_TOKENS"]

# Tokens per step the fused decoder serves (decode rows, verification rows): batch-32 decode steps
# included (on 2 Zen 1 cores, int4 + bf16 cache, 134M model: ~10% more tok/s than layer by layer,
# int8 ~25%). Larger steps (prompts) are matmul-bound and go layer by layer.
DECODE_MAX_TOKENS = 32
_ZERO_POINT = 128


@runtime_checkable
class KernelLinear(Protocol):
    def kernel_linear(self) -> tuple[Int8Packed | Int4Packed, torch.Tensor | None] | None:
        """The packed weights and the float32 bias (or None) the C kernels compute this layer with;
        None when this layer has no kernel form."""


_P, _I = ctypes.c_void_p, ctypes.c_int64


class _QLinear(ctypes.Structure):
    _fields_ = [
        ("kind", _I),
        ("n", _I),
        ("k", _I),
        ("k_pad", _I),
        ("group", _I),
        ("weight", _P),
        ("scales", _P),
        ("zp_col", _P),
        ("combined", _P),
        ("bias", _P),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("qkv", _QLinear),
        ("o", _QLinear),
        ("gate_up", _QLinear),
        ("down", _QLinear),
        ("in_norm", _P),
        ("post_norm", _P),
        ("k_cache", _P),
        ("v_cache", _P),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("n_layers", _I),
        ("hidden", _I),
        ("heads", _I),
        ("kv_heads", _I),
        ("head_dim", _I),
        ("inter", _I),
        ("block_size", _I),
        ("num_blocks", _I),
        ("window", _I),
        ("cache_bf16", _I),
        ("zp", _I),
        ("eps", ctypes.c_double),
        ("a_inv", ctypes.c_double),
        ("attn_scale", ctypes.c_double),
        ("layers", ctypes.POINTER(_Layer)),
    ]


def _qlinear(module) -> _QLinear | None:
    spec = module.kernel_linear() if isinstance(module, KernelLinear) else None
    if spec is None:
        return None
    packed, bias = spec
    bias_ptr = None if bias is None else bias.data_ptr()
    if isinstance(packed, Int8Packed):
        return _QLinear(
            1,
            packed.n,
            packed.k,
            packed.k_pad,
            0,
            packed.weight.data_ptr(),
            None,
            packed.zp_col.data_ptr(),
            packed.combined.data_ptr(),
            bias_ptr,
        )
    return _QLinear(
        2,
        packed.n,
        packed.k,
        packed.k_pad,
        packed.group,
        packed.weight.data_ptr(),
        packed.scales.data_ptr(),
        None,
        None,
        bias_ptr,
    )


class DecodePlan:
    """The C description of a model's layers over one KV cache. Holds the layers' modules (and so
    their tensors) alive as long as the plan lives."""

    def __init__(self, model: _Model, layers: ctypes.Array, keep: list) -> None:
        self._model, self._layers, self._keep = model, layers, keep

    @classmethod
    def build(cls, blocks, config, keys: list[torch.Tensor], values: list[torch.Tensor]) -> DecodePlan | None:
        """blocks: the transformer's layers (attention: qkv_proj, o_proj; mlp: gate_up_proj, down_proj;
        input_layernorm, post_attention_layernorm); keys/values: each layer's paged cache ([kv_heads, blocks,
        block_size, head_dim]). None when some
        layer cannot run fused."""
        if kernel_library() is None or not blocks:
            return None
        layers = (_Layer * len(blocks))()
        for i, block in enumerate(blocks):
            attn, mlp = block.self_attn, block.mlp
            linears = [_qlinear(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
            norms = (block.input_layernorm.weight, block.post_attention_layernorm.weight)
            if any(q is None for q in linears) or any(w.dtype != torch.float32 for w in norms):
                return None
            check_kv_cache(keys[i], values[i])
            layers[i] = _Layer(*linears, *(w.data_ptr() for w in norms), keys[i].data_ptr(), values[i].data_ptr())
        model = _Model(
            len(blocks),
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.intermediate_size,
            keys[0].shape[2],
            keys[0].shape[1],
            config.sliding_window or 0,
            int(keys[0].dtype == torch.bfloat16),
            _ZERO_POINT,
            config.rms_norm_eps,
            FBGEMM_UNIT_INV,
            1.0 / math.sqrt(config.head_dim),
            layers,
        )
        return cls(model, layers, [blocks, keys, values])

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch) -> None:
        """x: [N, hidden] float32 (contiguous), through every layer in place. cos/sin: [N, head_dim]
        float32 rows; batch: the step's ForwardBatch (a single VarlenGroup)."""
        group = batch.groups[0]
        status = kernel_library().tandem_decode_layers(
            ctypes.byref(self._model),
            x.data_ptr(),
            x.shape[0],
            cos.data_ptr(),
            sin.data_ptr(),
            batch.write_offsets.data_ptr(),
            batch.write_blocks.data_ptr(),
            len(group.offsets),
            group.offsets.data_ptr(),
            group.lengths.data_ptr(),
            group.starts.data_ptr(),
            group.tables.data_ptr(),
            group.tables.shape[1],
        )
        if status:
            raise MemoryError("fused decoder: could not allocate its buffers")
