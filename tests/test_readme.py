"""The README's Python API example runs as written."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _section_code(heading: str) -> str:
    text = README.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, f"no python block under '## {heading}'"
    return "\n".join(blocks)


def test_the_python_api_example_runs_as_written():
    out = subprocess.run(
        [sys.executable, "-c", _section_code("Python API")], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip(), "the example printed nothing"


def _first_curl_body() -> dict:
    """The JSON body of the Quick start's curl, as written."""
    import json

    section = README.read_text().split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"curl \S+/v1/completions .*?-d '(\{.*?\})'", section, re.S)
    assert match, "no curl to /v1/completions in the Quick start"
    return json.loads(match.group(1))


def test_the_quick_start_curl_prints_the_bundled_models_greedy_code(tmp_path):
    """The README's first curl omits temperature: the server takes the bundled model's generation_config.json
    (do_sample: false), so the answer is its greedy completion, code, not temperature-1 noise."""
    import httpx
    from server_process import ServerProcess

    from tandem.engine import Engine, EngineConfig, SamplingParams
    from tandem.model import load_model

    body = _first_curl_body()
    assert "temperature" not in body and body["model"] == "tandem-code-target"
    server = ServerProcess(["--recipe", "baseline", "--threads", "1"], tmp_path / "server.log")
    try:
        response = httpx.post(server.wait_ready().url + "/v1/completions", json=body, timeout=120)
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["text"]
    engine = Engine(load_model(), EngineConfig(num_threads=1, max_num_seqs=1))
    (greedy,) = engine.generate([body["prompt"]], SamplingParams.greedy_params(body["max_tokens"]))
    assert text == greedy.text
    assert "\n    " in text and "return" in text, text  # indented Python
