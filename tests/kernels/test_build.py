"""Building and loading the C kernels: cached per source, compiler and CPU; a clear error or a
fallback when they cannot be built."""

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
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    try:
        first = fresh_loader.build()
    except fresh_loader.KernelBuildError as exc:
        pytest.skip(f"no working C compiler: {exc}")
    assert first.parent == tmp_path / "kernels" and first.is_file()
    stamp = first.stat().st_mtime_ns
    assert fresh_loader.build() == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary files left


def test_a_failing_compiler_is_a_clear_error_and_a_warned_fallback(monkeypatch, tmp_path, fresh_loader):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
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
