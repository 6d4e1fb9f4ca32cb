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


ROOT = README.parents[0]
# Where a path the README names may live: from the repository root, or (a module, `tandem/x.py`,
# `sim/replica.py`) inside the package's source.
BASES = (ROOT, ROOT / "src", ROOT / "src" / "tandem")
TOP_LEVEL = {p.name for p in ROOT.iterdir()} - {".git", ".venv", "build"}
FILE_SUFFIXES = (".py", ".json", ".md", ".yaml", ".yml", ".csv", ".sh", ".png", ".html", ".toml", ".c")
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0")


def _mentioned_paths(text: str) -> set[str]:
    """Code spans that name a file or folder of this repository by a relative path: its first part is
    one of the repository's top-level entries, or it names a file (by its suffix). Bare file names
    (`load_test.json`, beside a folder named just before) are left out."""
    paths = set()
    for span in re.findall(r"`([^`\s]+)`", text):
        path = span.rstrip(".,:;")
        if path.startswith(("/", "~", "$", "http")) or "/" not in path:
            continue
        first = path.split("/", 1)[0]
        if first in TOP_LEVEL or path.endswith(FILE_SUFFIXES):
            paths.add(path)
    return paths


def test_every_path_the_readme_names_is_in_the_repository():
    paths = _mentioned_paths(README.read_text())
    assert len(paths) > 30, f"the README's paths were not found: {sorted(paths)}"
    missing = sorted(p for p in paths if not any(any(base.glob(p)) for base in BASES))
    assert not missing, f"README names paths that are not in the repository: {missing}"


def test_no_readme_link_leaves_the_repository():
    text = README.read_text()
    assert not re.findall(r"\.\./", text), "a path outside the repository (../)"
    links = re.findall(r"\]\(([^)]+)\)", text)  # markdown links: inside the repository only
    assert not [link for link in links if not any((base / link.split("#")[0]).exists() for base in BASES)]
    urls = re.findall(r"https?://([^/\s`'\")]+)", text)
    assert urls, "the README's curl examples were not found"
    outside = [host for host in urls if host.split(":")[0] not in LOCAL_HOSTS]
    assert not outside, f"links that leave the repository: {outside}"


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
