"""Real `tandem serve` processes on loopback, shared by the serve tests.

- `server`: open (no API key), 8 KV slots + a queue of 32, a 1024-token context.
- `guarded_server`: API key, one KV slot and no queue (a second request gets 429), 4 KiB bodies.
Both start at once on first use (in parallel), run with one torch thread (the tiny model gains
nothing from two, and the machine is shared), and are stopped at the end of the session.
- `fleet_server`: a replica of a gateway's fleet (TANDEM_FLEET_SECRET set), started on first use.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from server_process import ServerProcess

from tandem.model import Tokenizer

API_KEY = "test-key-123"
FLEET_SECRET = "fleet-secret-456"
MODEL_NAME = "tiny"
CONTEXT = 1024
# A generation_config.json that sets every sampling default tandem reads (the serve tests' defaults cases).
GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.9,
    "top_k": 7,
    "min_p": 0.02,
    "repetition_penalty": 1.3,
    "max_new_tokens": 9,
}


@pytest.fixture(scope="session")
def tokenizer(serve_model_dir) -> Tokenizer:
    return Tokenizer(serve_model_dir)


def server_args(model_dir: Path, *extra: str) -> list[str]:
    # The recipe is pinned: the default follows the latest bench, and the tests assert its label.
    return [
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--recipe",
        "baseline",
        "--threads",
        "1",
        *extra,
    ]


@pytest.fixture(scope="session")
def _servers(serve_model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("serve-logs")
    started = {
        "open": ServerProcess(
            server_args(serve_model_dir, "--max-num-seqs", "8", "--max-queue", "32"), logs / "open.log"
        ),
        "guarded": ServerProcess(
            server_args(serve_model_dir, "--max-num-seqs", "1", "--max-queue", "0", "--max-body-bytes", "4096"),
            logs / "guarded.log",
            env={"TANDEM_API_KEY": API_KEY},
        ),
    }
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(scope="session")
def server(_servers) -> ServerProcess:
    return _servers["open"].wait_ready()


@pytest.fixture(scope="session")
def guarded_server(_servers) -> ServerProcess:
    return _servers["guarded"].wait_ready()


@pytest.fixture(scope="session")
def fleet_server(serve_model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fleet-logs")
    process = ServerProcess(server_args(serve_model_dir), logs / "fleet.log", env={"TANDEM_FLEET_SECRET": FLEET_SECRET})
    try:
        yield process.wait_ready()
    finally:
        process.stop()
