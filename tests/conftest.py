import os
import subprocess
import sys
from pathlib import Path

import pytest

# `make test` runs two workers on a 2-core machine, each with its own replicas: OpenMP threads that
# spin while they wait only take the CPU from the others. Set before torch (or a replica) starts one.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Keep compiled bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE=1): without
# it every worker rewrites the asserts of all ~300 test files again at collection (about 10 s of CPU
# each on this machine) and every replica, bench row and CLI subprocess compiles tandem's modules
# afresh. Python checks each cached file against its source; __pycache__ is git-ignored.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

sys.path.insert(0, str(Path(__file__).parent))

# The files that take longest (real replicas, a fresh venv, a Ray cluster), handed to the workers
# first so that none is left running alone at the end (longest first packs two workers best).
LONGEST_FIRST = (
    "cluster/test_ray_cluster.py", "gate/test_cli.py", "test_wheel.py", "gateway/test_resume_live.py",
    "optimize/test_bench.py", "gateway/test_gate_live.py", "gateway/test_operator_errors.py", "gateway/test_run.py",
    "gateway/test_scaling.py", "gateway/test_slow_stream.py", "gateway/test_faults.py", "serve/test_structured.py",
    "gateway/test_fleet_payoff.py", "gateway/test_usage_restart.py", "gateway/test_tenants_live.py",
    "gateway/test_kv_routing_live.py", "serve/test_costly_requests.py", "gateway/test_traversal.py",
    "gateway/test_fleet_live.py", "optimize/test_adaptive.py", "gateway/test_liveness.py", "zoo/test_bundled_models.py",
    "engine/test_kv_blocks.py", "test_readme.py", "optimize/test_speculative.py", "serve/test_errors.py",
    "serve/test_fuzz.py", "gateway/test_schema_fuzz.py", "gateway/test_external_variants.py",
)  # fmt: skip


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with LONGEST_FIRST handed out first (xdist orders files by their number of
    tests, which leaves a one-test file such as the wheel's running alone at the end)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    def rank(scope: str) -> int:
        path = scope.removeprefix("tests/")
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    class LongestFirst(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:
                self.ordered = True
                queue = sorted(self.workqueue.items(), key=lambda unit: rank(unit[0]))  # stable
                self.workqueue.clear()
                self.workqueue.update(queue)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


from tiny_models import save_tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tiny random Llama, Mistral and Qwen2 checkpoints in HF format, built once per session."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: save_tiny(arch, root / arch) for arch in ("llama", "mistral", "qwen2")}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dirs) -> Path:
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory) -> Path:
    """A smaller random Llama sharing the tiny models' tokenizer: a (poor) draft for speculation."""
    return save_tiny("llama", tmp_path_factory.mktemp("draft") / "llama-draft", seed=1, num_hidden_layers=1)


@pytest.fixture(scope="session")
def serve_model_dir(tmp_path_factory) -> Path:
    """The tiny random Llama with a 1024-token context (so long streams stay in flight a while): the
    model real `tandem serve` replicas load in the serve, gateway and scheduling tests."""
    return save_tiny("llama", tmp_path_factory.mktemp("serve") / "tiny-serve", max_position_embeddings=1024)


GATE_TEST_PLUGINS = Path(__file__).parent / "plugins" / "tandem-gate-test-optimizers"


@pytest.fixture(scope="session")
def plugins(tmp_path_factory) -> Path:
    """The gate's broken test optimizers installed as their own distribution (found through the
    `tandem.optimizers` entry point): a folder to put on a replica's PYTHONPATH."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(GATE_TEST_PLUGINS)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    return target
