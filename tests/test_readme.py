"""The README (the front door) and the docs site: the Python API example runs as written, the paths
and links they name exist and stay inside the repository, and every docs page is reachable."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _section_code(heading: str, page: Path = README) -> str:
    text = page.read_text()
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
# Public upstream sites a page may link to, named one by one (none yet: everything else is in the repository).
UPSTREAM_HOSTS: tuple[str, ...] = ()


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


DOCS = ROOT / "docs"
# The front door and the docs site: what the README held before it became a front door lives there,
# so the path and link checks read both.
PAGES = (README, *sorted(DOCS.glob("*.md")))


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a `# comment` in a yaml block is no heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(page: Path) -> set[str]:
    """The heading ids MkDocs gives a page (Python-Markdown's toc slugify of the heading's text)."""
    from markdown.extensions.toc import slugify

    headings = re.findall(r"^#{1,6} (.+)$", _prose(page.read_text()), re.M)
    return {slugify(re.sub(r"[`*]", "", heading), "-") for heading in headings}


def test_every_path_the_readme_names_is_in_the_repository():
    paths = set().union(*(_mentioned_paths(page.read_text()) for page in PAGES))
    assert len(paths) > 30, f"the README's and docs' paths were not found: {sorted(paths)}"
    missing = sorted(p for p in paths if not any(any(base.glob(p)) for base in BASES))
    assert not missing, f"README or docs/ name paths that are not in the repository: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_link_leaves_the_repository(page):
    """Links stay inside the repository (the docs' between their own pages, so the site holds them
    too), each to a file that exists and a heading that exists; URLs only to this machine."""
    text = page.read_text()
    assert not re.findall(r"\.\./", text), "a path outside the repository (../)"
    bases = BASES if page == README else (page.parent,)
    broken = []
    for link in re.findall(r"\]\(([^)]+)\)", _prose(text)):  # markdown links: inside the repository only
        target, _, anchor = link.partition("#")
        found = [base / target for base in bases if (base / target).exists()] if target else [page]
        if not found or (anchor and anchor not in _anchors(found[0])):
            broken.append(link)
    assert not broken, f"links to no file or no heading: {broken}"
    if page.parent == DOCS:  # the site's pages link to each other, never to the repository's files
        assert not [link for link in re.findall(r"\]\(([^)#]+)", text) if not link.endswith(".md")]
    urls = re.findall(r"https?://([^/\s`'\")]+)", text)
    outside = [host for host in urls if host.split(":")[0] not in LOCAL_HOSTS + UPSTREAM_HOSTS]
    assert not outside, f"links that leave the repository: {outside}"


def test_the_readme_has_its_curl_examples_and_links_every_docs_page():
    text = README.read_text()
    assert re.findall(r"https?://127\.0\.0\.1", text), "the README's curl examples were not found"
    linked = {Path(link.partition("#")[0]) for link in re.findall(r"\]\((docs/[^)]+)\)", text)}
    unlinked = sorted(str(page.relative_to(ROOT)) for page in DOCS.glob("*.md") if page.relative_to(ROOT) not in linked)
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_the_site_lists_every_docs_page():
    """mkdocs.yml's nav names every page in docs/ (MkDocs only notes one left out) and nothing else
    (`mkdocs build --strict` in `make test` fails on a missing one)."""
    config = (ROOT / "mkdocs.yml").read_text()
    nav = set(re.findall(r"^  - [^:#]+: (\S+\.md)$", config, re.M))
    assert nav == {page.name for page in DOCS.glob("*.md")}


def test_the_getting_started_page_shows_the_readmes_python_api_block():
    """The block the first test runs is the one the site shows (they cannot drift apart)."""
    assert _section_code("Python API", DOCS / "getting-started.md") == _section_code("Python API")


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
