"""The small-batch int8 kernel gives bit for bit what Int8Linear's fbgemm path gives the same rows."""

import pytest
import torch

from tandem.kernels import int8_gemv_available, int8_linear_small
from tandem.optimize.int8 import Int8Linear

pytestmark = pytest.mark.skipif(not int8_gemv_available(), reason="no VNNI int8 kernel on this machine")


@pytest.mark.parametrize("n,k,bias", [(64, 384, False), (130, 1024, True), (7, 100, False), (33, 2048, True)])
def test_matches_the_fbgemm_path_bit_for_bit(n, k, bias):
    gen = torch.Generator().manual_seed(n + k)
    linear = torch.nn.Linear(k, n, bias=bias)
    layer = Int8Linear(linear)
    for rows in (1, 2, 3, 4):
        x = torch.randn(rows, k, generator=gen) * torch.logspace(-3, 3, rows)[:, None]
        x[:, 0] = x.abs().amax(dim=1)  # row maxima of 1 after scaling ...
        x = x / x[:, :1]
        # ... so these land exactly halfway between quantization steps, where rounding order shows.
        x[:, 1:9] = (torch.randint(-127, 127, (rows, 8), generator=gen).float() + 0.5) * (2 / 255)
        got = int8_linear_small(x, layer._weight_int8, layer._col_sums, layer._weight_scales, layer.bias)
        layer.gemv = False  # Int8Linear's fbgemm path for the same rows
        expected = layer(x)
        layer.gemv = True
        assert torch.equal(got, expected)


def test_refuses_more_rows_than_it_serves():
    layer = Int8Linear(torch.nn.Linear(64, 8))
    with pytest.raises(ValueError, match="1-4 float32 rows"):
        int8_linear_small(torch.zeros(5, 64), layer._weight_int8, layer._col_sums, layer._weight_scales, None)
