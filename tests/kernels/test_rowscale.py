"""Per-row scaling kernels for int8 Linear layers: the same numbers as the torch ops they replace."""

import pytest
import torch

from tandem.kernels import kernels_available, rows_to_unit, scale_rows

pytestmark = pytest.mark.skipif(not kernels_available(), reason="C kernels not built on this machine")


@pytest.mark.parametrize("rows,width", [(1, 384), (33, 1024), (300, 384)])
def test_rows_to_unit_divides_each_row_by_its_max_magnitude(rows, width):
    x = torch.randn(rows, width + 16, generator=torch.Generator().manual_seed(rows))[:, :width]  # strided rows
    x[0] = 0.0  # an all-zero row keeps a tiny positive scale, not a division by zero
    out = torch.empty(rows, width)
    scale = rows_to_unit(x, out)
    expected_scale = x.abs().amax(dim=1).clamp_min(1e-30)
    torch.testing.assert_close(scale, expected_scale, atol=0, rtol=0)
    torch.testing.assert_close(out, x / expected_scale[:, None], atol=0, rtol=2e-7)
    assert out.abs().amax() <= 1.0


def test_scale_rows_in_place_with_and_without_bias():
    y = torch.randn(40, 96, generator=torch.Generator().manual_seed(2))
    scale, bias = torch.rand(40) + 0.5, torch.randn(96)
    plain, biased = y.clone(), y.clone()
    scale_rows(plain, scale, None)
    scale_rows(biased, scale, bias)
    torch.testing.assert_close(plain, y * scale[:, None])
    torch.testing.assert_close(biased, y * scale[:, None] + bias)


def test_refuses_outputs_it_cannot_write():
    with pytest.raises(ValueError, match="contiguous float32"):
        rows_to_unit(torch.randn(2, 8), torch.empty(8, 2).T)
    with pytest.raises(ValueError, match="contiguous float32"):
        scale_rows(torch.randn(8, 2).T, torch.ones(2), None)
