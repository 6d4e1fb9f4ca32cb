"""A third-party optimizer installed as its own distribution is used by a recipe, no tandem change."""

import subprocess
import sys
from pathlib import Path

PLUGIN = Path(__file__).parents[1] / "plugins" / "tandem-example-optimizer"

SCRIPT = """
import sys, torch
from tandem.model import load_model
from tandem.optimize import apply_recipe, describe, names
assert "scale-logits" in names(), names()
model = load_model(sys.argv[1])
optimized = apply_recipe(model, "scale-logits(factor=3.0)")
tokens = torch.arange(3, 12)[None]
with torch.no_grad():
    base = model.module.logits(model.module(tokens))
    scaled = optimized.model.module.logits(optimized.model.module(tokens))
assert torch.allclose(scaled, 3.0 * base, atol=1e-4), (scaled - 3 * base).abs().max()
print(optimized.recipe, optimized.applied, dict((n, v) for n, v, *_ in describe())["scale-logits"])
"""


def test_entry_point_optimizer_from_a_separate_distribution(tmp_path, tiny_llama_dir):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(PLUGIN),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    assert (target / "tandem_example_optimizer").is_dir()
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_llama_dir)],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert "scale-logits(factor=3.0) (('scale-logits', '0.1.0'),) 0.1.0" in proc.stdout
