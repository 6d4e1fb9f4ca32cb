"""Fused float32 layer ops against the torch ops they replace."""

import pytest
import torch
import torch.nn.functional as F

from tandem.kernels import kernels_available, rms_norm, rope_and_cache, silu_mul
from tandem.model.rope import apply_rope

pytestmark = pytest.mark.skipif(not kernels_available(), reason="C kernels not built on this machine")


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_rope_and_cache_rotates_in_place_and_stores_keys_and_values(cache_dtype):
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, head_dim, n = 6, 2, 64, 70  # 70 tokens: the threaded path
    qkv = torch.randn(n, (heads + 2 * kv_heads) * head_dim, generator=gen)
    positions = torch.randint(0, 100, (n,), generator=gen)
    slots = torch.arange(n) % 5
    positions = positions + 100 * (torch.arange(n) // 5)  # distinct (slot, position) pairs
    angles = torch.rand(n, head_dim // 2, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    keys = torch.zeros(kv_heads, 5, 1500, head_dim, dtype=cache_dtype)  # head-major: [kv heads, blocks, ...]
    values = torch.zeros_like(keys)
    expected_qk = apply_rope(qkv[:, : (heads + kv_heads) * head_dim].view(n, -1, head_dim), cos[:, None], sin[:, None])
    v = qkv[:, (heads + kv_heads) * head_dim :].view(n, kv_heads, head_dim).clone()
    rope_and_cache(qkv, cos, sin, positions, slots, keys, values, heads)
    rotated = qkv[:, : (heads + kv_heads) * head_dim].view(n, -1, head_dim)
    torch.testing.assert_close(rotated, expected_qk)
    # The rotated keys are stored as torch's .to(cache dtype) stores them (bfloat16: round to nearest even).
    assert torch.equal(keys[:, slots, positions].transpose(0, 1), rotated[:, heads:].to(cache_dtype))
    assert torch.equal(values[:, slots, positions].transpose(0, 1), v.to(cache_dtype))


def test_rms_norm_with_and_without_the_residual_add():
    gen = torch.Generator().manual_seed(1)
    x, residual, weight = torch.randn(300, 384, generator=gen), torch.randn(300, 384, generator=gen), torch.rand(384)
    torch.testing.assert_close(rms_norm(x.clone(), weight, 1e-5), F.rms_norm(x, (384,), weight, 1e-5))
    stream = x.clone()
    normed = rms_norm(stream, weight, 1e-5, residual=residual)
    torch.testing.assert_close(stream, x + residual)  # the residual stream, updated in place
    torch.testing.assert_close(normed, F.rms_norm(x + residual, (384,), weight, 1e-5))


def test_silu_mul():
    gate_up = torch.randn(3, 5, 2 * 96, generator=torch.Generator().manual_seed(2)) * 4
    gate, up = gate_up.split(96, dim=-1)
    torch.testing.assert_close(silu_mul(gate_up), F.silu(gate) * up)


def test_refuses_tensors_it_cannot_read():
    with pytest.raises(ValueError, match="contiguous float32"):
        rms_norm(torch.randn(4, 8).to(torch.bfloat16), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        rms_norm(torch.randn(4, 8), torch.ones(8), 1e-5, residual=torch.randn(2, 8))
    with pytest.raises(ValueError, match="qkv must be float32"):
        rope_and_cache(
            torch.randn(2, 10),
            torch.ones(2, 4),
            torch.ones(2, 4),
            torch.zeros(2),
            torch.zeros(2),
            torch.zeros(1, 1, 8, 4),
            torch.zeros(1, 1, 8, 4),
            heads=1,
        )
