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
