"""Small-batch quantized Linear layers on VNNI-packed weights: int8 (bit for bit fbgemm's dynamic
path) and group-wise int4; AVX512-VNNI, or AVX2 where there is no VNNI (int8 weights then in
[-63, 63], as int8 quantizes them on such CPUs).

See csrc/quant_linear.c. Weights are packed once ([N/16] blocks of 16 output channels, 4 k per
channel per 64-byte vector), so a step streams each weight byte once for every row of the batch,
with no horizontal sums. `pack_int8` / `pack_int4` make the packed tensors; `int8_linear` /
`int4_linear` run a layer on up to QUANT_MAX_ROWS rows (more rows go to fbgemm or torch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.kernels.build import kernel_library, load_library

__all__ = [
    "QUANT_MAX_ROWS",
    "FBGEMM_UNIT_SCALE",
    "FBGEMM_UNIT_INV",
    "Int8Packed",
    "Int4Packed",
    "pack_int8",
    "pack_int4",
    "int8_linear",
    "int4_linear",
    "quant_kernels_available",
    "int8_kernel_max_weight",
    "quant_kernel_isa",
]

# Rows served by the packed kernels; at more rows fbgemm's blocked GEMM (int8) wins.
QUANT_MAX_ROWS = 16
# fbgemm's parameters for a dynamic range of [-1, 1]: scale (2/255 in double, stored as float) and
# its float reciprocal, which fbgemm multiplies by; zero point 128.
FBGEMM_UNIT_SCALE = torch.tensor(2.0 / 255.0, dtype=torch.float64).float()
FBGEMM_UNIT_INV = float(1.0 / FBGEMM_UNIT_SCALE)
_ZERO_POINT = 128


def quant_kernels_available() -> bool:
    """The kernels load and have a vector path: AVX512-VNNI, or AVX2 (without either, fbgemm and
    torch are faster)."""
    library = load_library()
    return library is not None and bool(library.tandem_quant_linear_fast())


def quant_kernel_isa() -> str | None:
    """Which vector path the quantized kernels have here: "avx512-vnni", "avx2", or None."""
    library = load_library()
    return {1: "avx512-vnni", 2: "avx2"}.get(library.tandem_quant_linear_fast()) if library is not None else None


def int8_kernel_max_weight() -> int:
    """The widest int8 weight magnitude the kernel multiplies exactly: 127 with VNNI; 63 on the
    AVX2 path, whose u8 x s8 pair sums are int16 (255 x 63 x 2 fits, 255 x 127 x 2 does not)."""
    return 63 if quant_kernel_isa() == "avx2" else 127


def _blocks(q: torch.Tensor, k_step: int) -> tuple[torch.Tensor, int, int]:
    """[N, K] -> zero-padded [N_pad, K_pad] (N_pad a multiple of 16, K_pad of k_step)."""
    n, k = q.shape
    n_pad, k_pad = -(-n // 16) * 16, -(-k // k_step) * k_step
    padded = q.new_zeros((n_pad, k_pad))
    padded[:n, :k] = q
    return padded, n_pad, k_pad


@dataclass(frozen=True)
class Int8Packed:
    """int8 weights [N, K] in VNNI blocks, with fbgemm's epilogue constants per channel."""

    weight: torch.Tensor  # [N_pad/16, K_pad/4, 16, 4] int8
    zp_col: torch.Tensor  # [N] int32: 128 * sum_k w[n, k]
    combined: torch.Tensor  # [N] float32: fbgemm's activation scale * w_scale[n]
    n: int
    k: int
    k_pad: int

    @property
    def nbytes(self) -> int:
        return self.weight.numel() + self.n * 8


@dataclass(frozen=True)
class Int4Packed:
    """int4 weights [N, K] (q in [-8, 7], one fp16 scale per channel and group) in VNNI blocks."""

    weight: torch.Tensor  # [N_pad/16, K_pad/8, 16, 4] uint8: low nibble k-step 2j, high 2j + 1
    scales: torch.Tensor  # [N_pad/16, K_pad/group, 16] float16
    n: int
    k: int
    k_pad: int
    group: int

    @property
    def nbytes(self) -> int:
        return self.weight.numel() + self.scales.numel() * 2


def pack_int8(q: torch.Tensor, w_scales: torch.Tensor) -> Int8Packed:
    """q: [N, K] int8 weights, w_scales: [N] float32 per-channel scales (fbgemm's). Refuses weights
    wider than this CPU's kernel multiplies exactly (int8_kernel_max_weight)."""
    limit = int8_kernel_max_weight()
    if q.numel() and int(q.abs().max()) > limit:
        raise ValueError(f"int8 weights reach {int(q.abs().max())}; the kernel on this CPU takes at most {limit}")
    n, k = q.shape
    padded, n_pad, k_pad = _blocks(q, 4)
    weight = padded.view(n_pad // 16, 16, k_pad // 4, 4).permute(0, 2, 1, 3).contiguous()
    zp_col = (_ZERO_POINT * q.sum(dim=1, dtype=torch.int32)).to(torch.int32)
    combined = FBGEMM_UNIT_SCALE * w_scales.float()  # one float32 product, as fbgemm's epilogue
    return Int8Packed(weight, zp_col.contiguous(), combined.contiguous(), n, k, k_pad)


def pack_int4(q: torch.Tensor, scales: torch.Tensor, group: int) -> Int4Packed:
    """q: [N, K] integers in [-8, 7]; scales: [N, ceil(K / group)] (stored as float16)."""
    if group % 8:
        raise ValueError(f"int4 group size must be a multiple of 8, got {group}")
    n, k = q.shape
    padded, n_pad, k_pad = _blocks((q + 8).to(torch.uint8), group)
    padded[:, k:] = 8  # padding weighs 0 (stored q + 8); its activations are 0 too
    padded[n:] = 8
    # [Nb, 16, K/8, 2, 4]: k = 8 j + 4 h + i; nibble h of byte (j, channel, i).
    steps = padded.view(n_pad // 16, 16, k_pad // 8, 2, 4).permute(0, 2, 1, 4, 3)
    weight = (steps[..., 0] | (steps[..., 1] << 4)).contiguous()
    groups = k_pad // group
    s = torch.zeros(n_pad, groups, dtype=torch.float16)
    s[:n, : scales.shape[1]] = scales.to(torch.float16)
    packed_scales = s.view(n_pad // 16, 16, groups).permute(0, 2, 1).contiguous()
    return Int4Packed(weight, packed_scales, n, k, k_pad, group)


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"expected float32 rows [R, {k}] with unit column stride, got {tuple(x.shape)} {x.dtype}")
    if not 1 <= x.shape[0]:
        raise ValueError("no rows")
    return x


def int8_linear(x: torch.Tensor, packed: Int8Packed, bias: torch.Tensor | None) -> torch.Tensor:
    """x [R, K] float32 -> [R, N] float32, bit for bit Int8Linear's fbgemm path."""
    x = _rows(x, packed.k)
    out = torch.empty((x.shape[0], packed.n), dtype=torch.float32)
    status = kernel_library().tandem_int8_linear(
        x.data_ptr(),
        x.stride(0),
        x.shape[0],
        packed.weight.data_ptr(),
        packed.zp_col.data_ptr(),
        packed.combined.data_ptr(),
        None if bias is None else bias.data_ptr(),
        FBGEMM_UNIT_INV,
        _ZERO_POINT,
        packed.n,
        packed.k,
        packed.k_pad,
        out.data_ptr(),
    )
    if status:
        raise ValueError(f"int8_linear: unsupported shape or out of memory (status {status})")
    return out


def int4_linear(x: torch.Tensor, packed: Int4Packed, bias: torch.Tensor | None) -> torch.Tensor:
    """x [R, K] float32 -> [R, N] float32 through the packed int4 weights."""
    x = _rows(x, packed.k)
    out = torch.empty((x.shape[0], packed.n), dtype=torch.float32)
    status = kernel_library().tandem_int4_linear(
        x.data_ptr(),
        x.stride(0),
        x.shape[0],
        packed.weight.data_ptr(),
        packed.scales.data_ptr(),
        None if bias is None else bias.data_ptr(),
        packed.n,
        packed.k,
        packed.k_pad,
        packed.group,
        out.data_ptr(),
    )
    if status:
        raise ValueError(f"int4_linear: unsupported shape or out of memory (status {status})")
    return out
