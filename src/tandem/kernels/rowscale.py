"""Per-row activation scaling for int8 Linear layers, one pass each way.

Int8Linear quantizes every activation row on its own scale (batch-invariant results). In torch
that is abs, amax, div before the int8 matmul and mul (and add) after it: four passes and four
dispatches per layer. These two kernels do each side in one pass.
"""

from __future__ import annotations

import torch

from tandem.kernels.build import kernel_library

__all__ = ["rows_to_unit", "scale_rows"]


def rows_to_unit(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """x: [R, W] float32 with unit column stride; writes x[r] / max|x[r]| into out ([R, W], contiguous)
    and returns the scales [R] (max |x[r]|, at least 1e-30)."""
    library = kernel_library()
    rows, width = x.shape
    if x.dtype != torch.float32 or x.stride(1) != 1:
        x = x.float().contiguous()
    if out.shape != x.shape or not out.is_contiguous() or out.dtype != torch.float32:
        raise ValueError("out must be a contiguous float32 tensor of x's shape")
    scale = torch.empty(rows, dtype=torch.float32)
    library.tandem_rows_to_unit(x.data_ptr(), x.stride(0), rows, width, out.data_ptr(), scale.data_ptr())
    return scale


def scale_rows(y: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
    """In place: y[r] = y[r] * scale[r] (+ bias). y: [R, W] contiguous float32."""
    library = kernel_library()
    if not y.is_contiguous() or y.dtype != torch.float32:
        raise ValueError("y must be a contiguous float32 tensor")
    rows, width = y.shape
    library.tandem_scale_rows(y.data_ptr(), rows, width, scale.data_ptr(), None if bias is None else bias.data_ptr())
