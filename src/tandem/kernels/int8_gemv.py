"""Small-batch int8 Linear (1-4 rows), bit-identical to fbgemm's dynamic path on unit-scaled rows.

See csrc/int8_gemv.c: fbgemm's GEMM packing and per-call dispatch dominate at decode's row counts;
this kernel streams each int8 weight row once with VNNI dot products. Same quantization, same
epilogue, so a row's output never depends on which path served it.
"""

from __future__ import annotations

import torch

from tandem.kernels.build import load_library

__all__ = [
    "int8_gemv",
    "int8_linear_small",
    "int8_gemv_available",
    "GEMV_MAX_ROWS",
    "FBGEMM_UNIT_SCALE",
    "FBGEMM_UNIT_INV",
]

GEMV_MAX_ROWS = 4
# fbgemm's parameters for a dynamic range of [-1, 1]: scale (2/255 in double, stored as float) and
# its float reciprocal, which fbgemm multiplies by; zero point 128.
FBGEMM_UNIT_SCALE = torch.tensor(2.0 / 255.0, dtype=torch.float64).float()
FBGEMM_UNIT_INV = float(1.0 / FBGEMM_UNIT_SCALE)
FBGEMM_UNIT_SCALE = float(FBGEMM_UNIT_SCALE)
_ZERO_POINT = 128


def int8_gemv_available() -> bool:
    """The kernel loads and has its VNNI path (without it, fbgemm is faster)."""
    library = load_library()
    return library is not None and bool(library.tandem_int8_gemv_fast())


def int8_gemv(
    x_unit: torch.Tensor, weight: torch.Tensor, col_sums: torch.Tensor, w_scales: torch.Tensor
) -> torch.Tensor:
    """x_unit: [R, K] float32 rows scaled to max |x| <= 1 (R <= GEMV_MAX_ROWS, unit column stride);
    weight: [N, K] int8; col_sums: [N] int32 (row sums of weight); w_scales: [N] float32.
    Returns [R, N] float32: exactly what fbgemm's linear_dynamic gives these rows with its range
    pinned to [-1, 1], before the rows' own scales are multiplied back."""
    rows, k = x_unit.shape
    n = weight.shape[0]
    if not 1 <= rows <= GEMV_MAX_ROWS:
        raise ValueError(f"int8_gemv takes 1 to {GEMV_MAX_ROWS} rows, got {rows}")
    if x_unit.dtype != torch.float32 or x_unit.stride(1) != 1:
        raise ValueError("x_unit must be float32 with unit column stride")
    if weight.dtype != torch.int8 or not weight.is_contiguous() or weight.shape[1] != k:
        raise ValueError("weight must be a contiguous int8 [N, K] tensor")
    out = torch.empty((rows, n), dtype=torch.float32)
    status = load_library().tandem_int8_gemv(
        x_unit.data_ptr(),
        x_unit.stride(0),
        rows,
        k,
        weight.data_ptr(),
        col_sums.data_ptr(),
        w_scales.data_ptr(),
        FBGEMM_UNIT_SCALE,
        FBGEMM_UNIT_INV,
        _ZERO_POINT,
        out.data_ptr(),
        n,
    )
    if status:
        raise ValueError(f"int8_gemv: unsupported shape ({rows} rows, K={k})")
    return out


def int8_linear_small(
    x: torch.Tensor,
    weight: torch.Tensor,
    col_sums: torch.Tensor,
    w_scales: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Int8Linear's whole forward for 1-4 rows in one call: x [R, K] float32 (unit column stride)
    -> [R, N] float32, bit-identical to its fbgemm path. The hot path of batch-1 decode, so it
    checks only what would make the kernel read out of bounds."""
    rows, k = x.shape
    if not 1 <= rows <= GEMV_MAX_ROWS or x.stride(1) != 1 or x.dtype != torch.float32 or weight.shape[1] != k:
        raise ValueError("int8_linear_small takes 1-4 float32 rows of the weight's width, unit column stride")
    out = torch.empty((rows, weight.shape[0]), dtype=torch.float32)
    status = load_library().tandem_int8_linear_small(
        x.data_ptr(),
        x.stride(0),
        rows,
        k,
        weight.data_ptr(),
        col_sums.data_ptr(),
        w_scales.data_ptr(),
        FBGEMM_UNIT_SCALE,
        FBGEMM_UNIT_INV,
        _ZERO_POINT,
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        weight.shape[0],
    )
    if status:
        raise ValueError(f"int8_linear_small: unsupported shape ({rows} rows, K={k})")
    return out
