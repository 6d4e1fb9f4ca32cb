"""Model shapes of the bundled target and draft, and what one token costs each of them in FLOPs.

The draft must cost at most 1/8 of the target per token, or speculative decoding cannot pay off:
with k drafted tokens per target pass, drafting alone costs k/8 of a target pass. Both models use
the tokenizer's vocabulary and tied embeddings (at this size the embedding matrix is a large part
of the parameters, and tying it helps small models).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.model.config import ModelConfig

__all__ = [
    "ModelShape",
    "TARGET_SHAPE",
    "DRAFT_SHAPE",
    "TINY_TARGET_SHAPE",
    "TINY_DRAFT_SHAPE",
    "model_config",
    "matmul_flops_per_token",
    "num_parameters",
]


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self}: heads must divide hidden_size and kv_heads must divide heads")


# Sized from a throughput trial on the 2-core build machine (bf16 autocast training): the target
# trains at ~2500 tokens/s, so ~23 minutes is ~1.2 epochs of the corpus.
TARGET_SHAPE = ModelShape(hidden_size=384, num_layers=8, num_heads=6, num_kv_heads=2, intermediate_size=1024)
DRAFT_SHAPE = ModelShape(hidden_size=128, num_layers=3, num_heads=2, num_kv_heads=1, intermediate_size=384)
# For tests and dry runs of the build pipeline: seconds, not minutes.
TINY_TARGET_SHAPE = ModelShape(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
TINY_DRAFT_SHAPE = ModelShape(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def model_config(
    shape: ModelShape,
    vocab_size: int,
    max_positions: int,
    bos_id: int,
    eos_id: int,
    rope_theta: float = 10000.0,
) -> ModelConfig:
    return ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.hidden_size // shape.num_heads,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        rope_theta=rope_theta,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        bos_token_id=bos_id,
        eos_token_ids=(eos_id,),
    )


def num_parameters(config: ModelConfig) -> int:
    return config.num_parameters


def matmul_flops_per_token(config: ModelConfig, context: int = 0) -> int:
    """Multiply-add FLOPs (2 per MAC) of one token's forward pass: every weight matmul including
    lm_head (the embedding lookup is free), plus attention scores and values over `context` keys."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    q_dim = config.num_attention_heads * config.head_dim
    kv_dim = config.num_key_value_heads * config.head_dim
    per_layer = h * (q_dim + 2 * kv_dim) + q_dim * h + 3 * h * i
    weights = layers * per_layer + h * config.vocab_size
    attention = layers * 2 * context * q_dim  # q.k over context keys, then the weighted sum of values
    return 2 * (weights + attention)
