"""tandem's C kernels for the CPU (built on first use; pure-torch paths serve when unavailable)."""

from tandem.kernels.attention import varlen_attention
from tandem.kernels.build import KernelBuildError, cache_dir, kernels_available, kernels_enabled, load_library
from tandem.kernels.fused import rms_norm, rope_and_cache, silu_mul
from tandem.kernels.int8_gemv import GEMV_MAX_ROWS, int8_gemv_available, int8_linear_small
from tandem.kernels.rowscale import rows_to_unit, scale_rows

__all__ = [
    "GEMV_MAX_ROWS",
    "KernelBuildError",
    "cache_dir",
    "int8_gemv_available",
    "int8_linear_small",
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
