"""The small-batch int8 kernel gives bit-for-bit what fbgemm's dynamic path gives the same rows."""

import warnings

import pytest
import torch

from tandem.kernels import int8_gemv, int8_gemv_available

pytestmark = pytest.mark.skipif(not int8_gemv_available(), reason="no VNNI int8 kernel on this machine")


def quantized(n, k, seed):
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    scales = (weight.abs().amax(dim=1) / 127).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qweight = torch.quantize_per_channel(weight, scales, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qweight, None)
    plain = qweight.int_repr().contiguous()
    return packed, plain, plain.sum(dim=1, dtype=torch.int32), qweight.q_per_channel_scales().float()


@pytest.mark.parametrize("n,k", [(64, 384), (130, 1024), (7, 100), (33, 2048)])
def test_matches_fbgemm_bit_for_bit(n, k):
    packed, plain, col_sums, scales = quantized(n, k, seed=n + k)
    gen = torch.Generator().manual_seed(k)
    for rows in (1, 2, 3, 4):
        x = torch.randn(rows, k, generator=gen)
        # Values exactly halfway between quantization steps, where rounding order shows.
        x[:, :8] = (torch.randint(-127, 127, (rows, 8), generator=gen).float() + 0.5) * (2 / 255)
        x = x / x.abs().amax(dim=1, keepdim=True)
        pinned = torch.cat([torch.zeros(1, k), x])
        pinned[0, 0], pinned[0, -1] = 1.0, -1.0  # how Int8Linear pins fbgemm's range to [-1, 1]
        expected = torch.ops.quantized.linear_dynamic(pinned, packed, reduce_range=False)[1:]
        assert torch.equal(int8_gemv(pinned[1:], plain, col_sums, scales), expected)


def test_refuses_more_rows_than_it_serves():
    _, plain, col_sums, scales = quantized(8, 64, seed=0)
    with pytest.raises(ValueError, match="1 to 4 rows"):
        int8_gemv(torch.zeros(5, 64), plain, col_sums, scales)
