"""Building and loading the C kernels: cached per source, compiler and CPU; a clear error or a
fallback when they cannot be built."""

import os

import pytest

from tandem.kernels import build as kernel_build


@pytest.fixture
def fresh_loader():
    kernel_build.load_library.cache_clear()
    yield kernel_build
    kernel_build.load_library.cache_clear()


def test_disabled_by_environment(monkeypatch, fresh_loader):
    monkeypatch.setenv("TANDEM_KERNELS", "torch")
    assert fresh_loader.load_library() is None


def test_builds_once_into_the_cache(monkeypatch, tmp_path, fresh_loader):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    try:
        first = fresh_loader.build()
    except fresh_loader.KernelBuildError as exc:
        pytest.skip(f"no working C compiler: {exc}")
    assert first.parent == tmp_path / "kernels" and first.is_file()
    stamp = first.stat().st_mtime_ns
    assert fresh_loader.build() == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary files left


def test_a_failing_compiler_is_a_clear_error_and_a_warned_fallback(monkeypatch, tmp_path, fresh_loader):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    monkeypatch.setenv("TANDEM_KERNELS", "c")
    with pytest.raises(fresh_loader.KernelBuildError, match="compiling cpu_kernels.c with false failed"):
        fresh_loader.build()
    with pytest.warns(RuntimeWarning, match="using torch paths"):
        assert fresh_loader.load_library() is None
    assert list((tmp_path / "kernels").iterdir()) == []


def test_loading_keeps_denormals(fresh_loader):
    """A library linked with -ffast-math would switch the whole process to flush-to-zero on load."""
    if fresh_loader.load_library() is None:
        pytest.skip("C kernels not built on this machine")
    tiny = float.fromhex("0x0.0000000000001p-1022")  # the smallest denormal, 5e-324
    assert tiny * 1.5 > 0.0


def test_kernels_follow_torchs_thread_count_from_any_thread():
    """An engine steps in a Python thread (AsyncEngine): its kernels must use torch's thread count
    (--threads), not that thread's OpenMP default, or co-located replicas oversubscribe the cores."""
    import threading

    import torch

    if kernel_build.load_library() is None:
        pytest.skip("C kernels not built on this machine")
    before = torch.get_num_threads()
    widths = []

    def step_thread():
        for threads in (1, 2):
            torch.set_num_threads(threads)
            widths.append(kernel_build.kernel_library().tandem_parallel_width())

    try:
        worker = threading.Thread(target=step_thread)
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(before)
    assert widths[0] == 1
    assert widths[1] == min(2, os.cpu_count() or 1)


def run_main(tmp_path, **env):
    import subprocess
    import sys

    environment = {**os.environ, "TANDEM_CACHE": str(tmp_path), "TANDEM_KERNELS": "c", **env}
    return subprocess.run([sys.executable, "-m", "tandem.kernels"], env=environment, capture_output=True, text=True)


def test_make_kernels_fails_when_a_present_compiler_fails(tmp_path):
    """`make setup` / `make test` run `python -m tandem.kernels`: a broken build must stop them."""
    done = run_main(tmp_path, CC="false")
    assert done.returncode == 1 and "FAILED to build" in done.stdout


def test_make_kernels_passes_without_a_compiler(tmp_path):
    """No compiler at all: the torch paths serve, and setup and test go on."""
    done = run_main(tmp_path, CC="", PATH=str(tmp_path))
    assert done.returncode == 0 and "no C compiler" in done.stdout


def test_kernels_load_wherever_a_compiler_is_present():
    """Kernel tests skip only where no compiler exists (or TANDEM_KERNELS=torch), never because a
    build failed: where a compiler is present, the library must load."""
    import shutil

    if not kernel_build.kernels_enabled():
        pytest.skip("TANDEM_KERNELS disables the C kernels")
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on this machine: the torch paths serve")
    kernel_build.build()  # raises with the compiler's output if the sources do not build
    assert kernel_build.load_library() is not None
