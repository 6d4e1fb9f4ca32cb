"""Real third-party clients nobody here wrote, against `tandem serve` and the gateway: guidellm
(streaming) and aiperf (streaming chat). Each must finish its requests with zero errors.

Marked `clients`; they need the clients' own venv (guidellm and aiperf pull torch, datasets and more:
about 6.5 GB and 40 minutes to install here), which `make clients` builds in .clients-venv and then
runs these tests with. Without it they skip (so `make test` costs nothing for them). Both tools read
the bundled model's tokenizer from its directory (offline).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from server_process import ServerProcess

from tandem.data.bundled import bundled_model_dir

pytestmark = pytest.mark.clients

VENV = Path(os.environ.get("TANDEM_CLIENTS_VENV", Path(__file__).resolve().parents[2] / ".clients-venv"))
BIN = VENV / "bin"
if not (BIN / "guidellm").exists() or not (BIN / "aiperf").exists():
    pytest.skip(f"guidellm and aiperf are not installed in {VENV}: run `make clients`", allow_module_level=True)

MODEL = "tandem-code-target"
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# aiperf's offline mode looks a tokenizer up in the hub's cache even for a local path; online, it
# reads a local path as is (and asks the hub nothing).
LOCAL = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
SERVER_ARGS = ["--threads", "1"]


@pytest.fixture(scope="module", params=["server", "gateway"])
def target(request, tmp_path_factory):
    """A lone replica, and a gateway over one replica (same recipe, one thread each)."""
    tmp = tmp_path_factory.mktemp(request.param)
    gateway = ["--replicas-min", "1", "--replicas-max", "1", "--policy", "hpa", "--log-dir", str(tmp / "replicas")]
    args = SERVER_ARGS if request.param == "server" else [*SERVER_ARGS, *gateway]
    proc = ServerProcess(args, tmp / "serve.log", env={"OMP_WAIT_POLICY": "PASSIVE"}).wait_ready(timeout=600)
    try:
        yield proc
    finally:
        proc.stop()


def _run(command: list[str], log: Path, env: dict[str, str], timeout: float = 900) -> None:
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
    assert done.returncode == 0, f"{command[0]} exited {done.returncode}:\n{log.read_text()[-4000:]}"


def test_guidellm_streams_with_zero_errors(target, tmp_path):
    report = tmp_path / "guidellm.json"
    _run(
        [
            str(BIN / "guidellm"), "run", "--backend", f"kind=openai_http,target={target.url}",
            "--profile", "kind=concurrent,streams=2", "--constraint", "kind=max_requests,count=8",
            "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=16",
            "--tokenizer", f"kind=huggingface_auto,model={bundled_model_dir()}",
            "--output", f"kind=json,path={report}", "--disable-console-interactive",
        ],
        tmp_path / "guidellm.log",
        OFFLINE,
    )  # fmt: skip
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    assert totals["errored"] == 0 and totals["incomplete"] == 0 and totals["successful"] == 8


def test_aiperf_streams_chat_with_zero_errors(target, tmp_path):
    artifacts = tmp_path / "aiperf"
    _run(
        [
            str(BIN / "aiperf"), "profile", "--model", MODEL, "--url", target.url, "--endpoint-type", "chat",
            "--streaming", "--tokenizer", str(bundled_model_dir()), "--request-count", "8", "--concurrency", "2",
            "--synthetic-input-tokens-mean", "32", "--output-tokens-mean", "16", "--artifact-dir", str(artifacts),
            "--ui-type", "none",
        ],
        tmp_path / "aiperf.log",
        LOCAL,
    )  # fmt: skip
    (summary,) = artifacts.rglob("profile_export_aiperf.json")
    records = json.loads(summary.read_text())
    assert records["request_count"]["avg"] == 8 and records["error_summary"] == []
