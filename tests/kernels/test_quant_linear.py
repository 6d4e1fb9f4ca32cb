"""The packed quantized kernels: int8 bit for bit Int8Linear's fbgemm path, int4 against a
reference dequantized matmul."""

import pytest
import torch

from tandem.kernels import (
    QUANT_MAX_ROWS,
    int4_linear,
    int8_kernel_max_weight,
    int8_linear,
    pack_int4,
    pack_int8,
    quant_kernels_available,
)
from tandem.optimize.int8 import Int8Linear

pytestmark = pytest.mark.skipif(not quant_kernels_available(), reason="no quantized kernels (VNNI, AVX2) here")


@pytest.mark.parametrize("n,k,bias", [(64, 384, False), (130, 1024, True), (7, 100, False), (33, 2048, True)])
def test_int8_matches_the_fbgemm_path_bit_for_bit(n, k, bias):
    gen = torch.Generator().manual_seed(n + k)
    linear = torch.nn.Linear(k, n, bias=bias)
    layer = Int8Linear(linear)
    for rows in (1, 2, 3, 4, 5, 8, 11, QUANT_MAX_ROWS):
        x = torch.randn(rows, k, generator=gen) * torch.logspace(-3, 3, rows)[:, None]
        x[:, 0] = x.abs().amax(dim=1)  # row maxima of 1 after scaling ...
        x = x / x[:, :1]
        # ... so these land exactly halfway between quantization steps, where rounding order shows.
        x[:, 1:9] = (torch.randint(-127, 127, (rows, 8), generator=gen).float() + 0.5) * (2 / 255)
        got = int8_linear(x, layer.packed, layer.bias)
        layer.gemv = False  # Int8Linear's fbgemm path for the same rows
        expected = layer(x)
        layer.gemv = True
        assert torch.equal(got, expected), rows


def test_int8_takes_strided_rows():
    layer = Int8Linear(torch.nn.Linear(96, 40))
    wide = torch.randn(3, 200)
    strided = wide[:, 10:106]
    assert torch.equal(int8_linear(strided, layer.packed, None), int8_linear(strided.contiguous(), layer.packed, None))


def test_int8_is_exact_at_the_widest_weights_and_activations_it_takes():
    """Every product at its largest (activation byte 255 against the widest weight the CPU's kernel
    takes; on AVX2 its int16 pair sums are then 32130, one step from saturating): exact sums."""
    limit, k = int8_kernel_max_weight(), 64
    q = torch.full((16, k), limit, dtype=torch.int8)
    q[1::2] = -limit  # odd channels negative
    packed = pack_int8(q, torch.full((16,), 1.0))
    x = torch.ones(1, k)  # unit rows: 1.0 quantizes to byte 255 (fbgemm's [-1, 1] grid, zero point 128)
    got = int8_linear(x, packed, None)
    # out = (sum_k 255 w - 128 sum_k w) x (2 / 255) x w_scale, every term exact in float32
    expected = torch.tensor([(255 - 128) * k * limit * (1 if c % 2 == 0 else -1) for c in range(16)]).float()
    assert torch.equal(got[0], expected * packed.combined)


def test_int8_refuses_weights_wider_than_the_kernel_multiplies_exactly():
    limit = int8_kernel_max_weight()
    if limit == 127:
        pytest.skip("the VNNI kernel takes every int8 weight")
    with pytest.raises(ValueError, match=f"at most {limit}"):
        pack_int8(torch.full((16, 8), limit + 1, dtype=torch.int8), torch.ones(16))


def reference_int4(x, q, scales, group, bias):
    """Dequantized weights times the activations, quantized as the kernel quantizes them."""
    n, k = q.shape
    w = (q.float().view(n, -1, group) * scales.to(torch.float16).float()[:, :, None]).view(n, k)
    m = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    xq = torch.round(x / m * 127)  # round half to even, as nearbyintf
    out = (xq.double() @ w.double().t()) * (m.double() / 127)
    return (out + bias.double() if bias is not None else out).float()


@pytest.mark.parametrize("n,k,group,bias", [(64, 256, 32, False), (200, 768, 64, True), (33, 384, 128, False)])
def test_int4_matches_a_dequantized_matmul(n, k, group, bias):
    gen = torch.Generator().manual_seed(n * k)
    q = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3
    b = torch.randn(n, generator=gen) if bias else None
    packed = pack_int4(q, scales, group)
    for rows in (1, 2, 3, 4, 6, 9, QUANT_MAX_ROWS, 32):  # int4's kernel serves every row count
        x = torch.randn(rows, k, generator=gen)
        got = int4_linear(x, packed, b)
        expected = reference_int4(x, q, scales, group, b)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("k,group", [(768, 32), (1000, 32), (384, 128), (2048, 64), (200, 8)])
def test_int4_rows_get_the_same_bits_in_any_batch(k, group):
    """Batched steps (2+ rows: K in chunks, 4-row tiles) and single-row steps (the one-row tile)
    sum the same integers and run the same float epilogue per group: a row's output is bit for bit
    the same whichever batch it rides in."""
    gen = torch.Generator().manual_seed(k + group)
    n = 72
    q = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, -(-k // group), generator=gen) * 0.02 + 1e-3
    packed = pack_int4(q, scales, group)
    bias = torch.randn(n, generator=gen)
    x = torch.randn(32, k, generator=gen) * torch.logspace(-2, 2, 32)[:, None]
    alone = torch.cat([int4_linear(x[i : i + 1], packed, bias) for i in range(32)])
    for rows in (2, 3, 4, 5, 7, 16, 32):
        assert torch.equal(int4_linear(x[:rows], packed, bias), alone[:rows]), rows


@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("q_value", [7, -8])
def test_int4_sums_at_the_int16_limit_are_exact(group, q_value):
    """Every weight at one extreme and every activation at 127 in magnitude: the AVX2 path's int16
    partial sums (32 k of u4 x s8 products) reach their largest, 30480, and the result is still exact."""
    n, k = 48, 256
    q = torch.full((n, k), q_value, dtype=torch.int8)
    scales = torch.full((n, k // group), 1e-3)
    packed = pack_int4(q, scales, group)
    for rows in (1, 4, 32):
        x = torch.ones(rows, k)
        x[1::2] = -1.0  # rows alternate sign
        got = int4_linear(x, packed, None)
        torch.testing.assert_close(got, reference_int4(x, q, scales, group, None), rtol=1e-6, atol=0)


def test_int4_pads_a_width_that_is_not_a_multiple_of_the_group():
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(-8, 8, (20, 100), generator=gen, dtype=torch.int8)
    scales = torch.rand(20, 4, generator=gen) * 0.01 + 1e-3
    x = torch.randn(2, 100, generator=gen)
    padded_q = torch.cat([q, torch.zeros(20, 28, dtype=torch.int8)], dim=1)
    expected = reference_int4(torch.cat([x, torch.zeros(2, 28)], dim=1), padded_q, scales, 32, None)
    torch.testing.assert_close(int4_linear(x, pack_int4(q, scales, 32), None), expected, rtol=1e-5, atol=1e-4)


def test_bad_rows_are_refused():
    packed = pack_int4(torch.zeros(16, 64, dtype=torch.int8), torch.ones(16, 2), 32)
    with pytest.raises(ValueError, match="float32 rows"):
        int4_linear(torch.zeros(2, 63), packed, None)
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_int4(torch.zeros(16, 64, dtype=torch.int8), torch.ones(16, 2), 12)
