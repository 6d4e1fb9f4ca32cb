"""Compile tandem's C kernels for this CPU on first use, cache the library, load it through ctypes.

Why C through ctypes: torch's varlen attention is CUDA-only and Intel's extension (the CPU one)
stopped at torch 2.8, so nothing installable reads each sequence's own keys from a KV cache on a
CPU. Three plain C files with no torch headers (csrc/) compile in about a second with the system
compiler, at -march=native, so one build fits the machine it serves (the cache key holds the CPU's
flags). Builds are atomic (a temporary file renamed into place), so processes starting together
never load a half-written library.

Disabled with TANDEM_KERNELS=torch (every caller then runs its pure-torch path). A missing or
failing compiler, or a library missing a symbol, is reported once, as a warning, and the torch
paths serve.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch  # noqa: F401  (loads torch's OpenMP runtime first, so the kernels share its thread pool)

__all__ = [
    "load_library",
    "kernel_library",
    "kernels_available",
    "kernels_enabled",
    "check_kv_cache",
    "cache_dir",
    "KernelBuildError",
    "NoCompilerError",
    "SOURCE",
]

SOURCE = Path(__file__).with_name("csrc") / "cpu_kernels.c"
# The int8 kernel's quantization must round exactly as fbgemm does: no -ffast-math there.
EXACT_SOURCE = SOURCE.with_name("quant_linear.c")
# The fused decoder: only calls the other two files' functions (and adds), compiled like the exact one.
DECODE_SOURCE = SOURCE.with_name("decode.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC"]
# -ffast-math at compile time only, and only for cpu_kernels.c: it lets loops call glibc's
# vectorised expf (libmvec). Linked with it, gcc adds crtfastmath.o, which turns on flush-to-zero
# for the whole process when the library loads and silently changes every other computation's
# denormals (5e-324 would read as 0.0).
FAST_FLAGS = ["-ffast-math"]
LINK_FLAGS = ["-shared", "-fopenmp"]
# gcc's tuning for AMD Zen 1 (-march=native there) splits every unaligned 256-bit load and store in
# two 128-bit halves; whole ones are 1-7% faster in the quantized kernels on that CPU (the same
# instructions otherwise, the same results). Used where the compiler takes them (gcc on x86).
TUNING_FLAGS = ["-mno-avx256-split-unaligned-load", "-mno-avx256-split-unaligned-store"]
LIBS = ["-lmvec", "-lm"]

_P, _I, _INT, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "tandem_varlen_attention": [_P, _I, _P, _P, _P, _INT, _I, _P, _P, _P, _P, _I, _INT, _INT, _INT, _I, _I, _I, _F],
    "tandem_rows_to_unit": [_P, _I, _I, _I, _P, _P],
    "tandem_scale_rows": [_P, _I, _I, _P, _P],
    "tandem_rope_and_cache": [_P, _I, _I, _P, _P, _P, _P, _P, _P, _INT, _INT, _INT, _INT, _I, _I],
    "tandem_rms_norm": [_P, _P, _P, _P, _I, _I, _F],
    "tandem_silu_mul": [_P, _P, _I, _I],
    "tandem_quant_linear_fast": [],
    "tandem_set_threads": [_INT],
    "tandem_parallel_width": [],
    "tandem_int8_linear": [_P, _I, _I, _P, _P, _P, _P, _F, ctypes.c_int32, _I, _I, _I, _P],
    "tandem_int4_linear": [_P, _I, _I, _P, _P, _P, _I, _I, _I, _I, _P],
    "tandem_decode_layers": [_P, _P, _I, _P, _P, _P, _P, _I, _P, _P, _P, _P, _I],
}
_INT_RESULTS = (
    "tandem_varlen_attention",
    "tandem_quant_linear_fast",
    "tandem_int8_linear",
    "tandem_int4_linear",
    "tandem_decode_layers",
    "tandem_parallel_width",
)
_RESTYPES = dict.fromkeys(_INT_RESULTS, ctypes.c_int)


class KernelBuildError(RuntimeError):
    """The C kernels could not be compiled or loaded; the message holds the compiler's output."""


class NoCompilerError(KernelBuildError):
    """No C compiler on this machine: the torch paths serve (not a failure of the kernels' sources)."""


def kernels_enabled() -> bool:
    return os.environ.get("TANDEM_KERNELS", "c").lower() not in ("torch", "off", "0", "none")


def cache_dir() -> Path:
    """$TANDEM_CACHE/kernels (default ~/.cache/tandem/kernels): tandem's one cache folder, as for
    profiles and logs."""
    return Path(os.environ.get("TANDEM_CACHE") or os.path.expanduser("~/.cache/tandem")) / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise NoCompilerError("no C compiler found (set CC, or install gcc)")
    return compiler


@functools.cache
def _compile_flags(compiler: str) -> tuple[str, ...]:
    """FLAGS, plus TUNING_FLAGS where this compiler takes them (one empty compile to ask)."""
    try:
        done = subprocess.run(
            [compiler, *FLAGS, *TUNING_FLAGS, "-x", "c", "-c", "-o", os.devnull, "-"],
            input="",
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return tuple(FLAGS)
    return tuple(FLAGS + TUNING_FLAGS) if done.returncode == 0 else tuple(FLAGS)


def build(target: Path | None = None) -> Path:
    """Compile the kernels (if this source, compiler and CPU have no build yet); return the library."""
    compiler = _compiler()
    sources = [path.read_bytes() for path in (SOURCE, EXACT_SOURCE, DECODE_SOURCE)]
    # The key names the flags asked for: whether this compiler takes TUNING_FLAGS follows from the compiler,
    # also in the key, so a cached build is found without asking it (every process start looks).
    flags = " ".join(FLAGS + TUNING_FLAGS + FAST_FLAGS + LINK_FLAGS + LIBS).encode()
    key = hashlib.sha256(b"\0".join([*sources, flags, compiler.encode(), _cpu_flags().encode()]))
    target = target or cache_dir() / f"tandem_cpu_{key.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    compile_flags = _compile_flags(compiler)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes starting together never load a half-written file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    objects = [tmp[:-3] + ".o", tmp[:-3] + "_exact.o", tmp[:-3] + "_decode.o"]
    commands = [
        [compiler, *compile_flags, *FAST_FLAGS, "-c", "-o", objects[0], str(SOURCE)],
        [compiler, *compile_flags, "-c", "-o", objects[1], str(EXACT_SOURCE)],
        [compiler, *compile_flags, "-c", "-o", objects[2], str(DECODE_SOURCE)],
        [compiler, *LINK_FLAGS, "-o", tmp, *objects, *LIBS],
    ]
    try:
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                detail = f":\n{done.stderr.strip()}" if done.stderr.strip() else ""
                name = Path(command[-1]).name if "-c" in command else "the kernels' library"
                raise KernelBuildError(f"compiling {name} with {compiler} failed (exit {done.returncode}){detail}")
        os.replace(tmp, target)
    finally:
        for leftover in (tmp, *objects):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return target


@functools.cache
def load_library() -> ctypes.CDLL | None:
    """The compiled kernels, or None when disabled or unbuildable (warned once)."""
    if not kernels_enabled():
        return None
    try:
        library = ctypes.CDLL(str(build()))
    except (KernelBuildError, OSError, subprocess.SubprocessError) as exc:
        warnings.warn(f"tandem C kernels unavailable, using torch paths: {exc}", RuntimeWarning, stacklevel=2)
        return None
    try:
        for name, argtypes in _SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes, function.restype = argtypes, _RESTYPES.get(name)
    except AttributeError as exc:  # a library from elsewhere, or damaged: never half-load it
        warnings.warn(f"tandem C kernels unusable, using torch paths: {exc}", RuntimeWarning, stacklevel=2)
        return None
    return library


_threads_set = [0]


def kernels_available() -> bool:
    """The C kernels are enabled, built and loaded (else every caller keeps its torch path)."""
    return load_library() is not None


def kernel_library() -> ctypes.CDLL | None:
    """The loaded kernels (None without them), their thread count matched to torch's (process-wide,
    as torch's is)."""
    library = load_library()
    if library is None:
        return None
    threads = torch.get_num_threads()
    if threads != _threads_set[0]:
        library.tandem_set_threads(threads)
        _threads_set[0] = threads
    return library


def check_kv_cache(keys: torch.Tensor, values: torch.Tensor) -> None:
    """The KV-cache layout every kernel reads and writes: contiguous, one shape, float32 or bfloat16."""
    if keys.dtype not in (torch.float32, torch.bfloat16) or values.dtype != keys.dtype:
        raise TypeError(f"KV cache must be float32 or bfloat16, got {keys.dtype}/{values.dtype}")
    if not (keys.is_contiguous() and values.is_contiguous()) or values.shape != keys.shape:
        raise ValueError("keys and values must be contiguous caches of one shape")
