"""tandem's C kernels for the CPU (built on first use; pure-torch paths serve when unavailable)."""

from tandem.kernels.attention import varlen_attention
from tandem.kernels.build import KernelBuildError, cache_dir, kernels_available, kernels_enabled, load_library
from tandem.kernels.decode import DECODE_MAX_TOKENS, DecodePlan, KernelLinear
from tandem.kernels.fused import rms_norm, rope_and_cache, silu_mul
from tandem.kernels.quant_linear import (
    QUANT_MAX_ROWS,
    Int4Packed,
    Int8Packed,
    int4_linear,
    int8_kernel_max_weight,
    int8_linear,
    pack_int4,
    pack_int8,
    quant_kernel_isa,
    quant_kernels_available,
)
from tandem.kernels.rowscale import rows_to_unit, scale_rows

__all__ = [
    "DECODE_MAX_TOKENS",
    "DecodePlan",
    "KernelLinear",
    "QUANT_MAX_ROWS",
    "Int4Packed",
    "Int8Packed",
    "KernelBuildError",
    "cache_dir",
    "int4_linear",
    "int8_kernel_max_weight",
    "int8_linear",
    "pack_int4",
    "pack_int8",
    "quant_kernel_isa",
    "quant_kernels_available",
    "rms_norm",
    "rope_and_cache",
    "silu_mul",
    "kernels_available",
    "kernels_enabled",
    "load_library",
    "rows_to_unit",
    "scale_rows",
    "varlen_attention",
]
