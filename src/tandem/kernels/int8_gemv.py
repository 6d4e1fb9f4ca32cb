"""Small-batch int8 Linear (1-4 rows), bit-identical to Int8Linear's fbgemm path.

See csrc/int8_gemv.c: fbgemm's GEMM packing and per-call dispatch dominate at decode's row counts;
this kernel streams each int8 weight row once with VNNI dot products. Same quantization, same
epilogue, so a row's output never depends on which path served it.
"""

from __future__ import annotations

import torch

from tandem.kernels.build import kernel_library, load_library

__all__ = [
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
    status = kernel_library().tandem_int8_linear_small(
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
