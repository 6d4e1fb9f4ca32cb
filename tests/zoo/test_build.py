"""The build pipeline end to end on a tiny corpus: a few steps, then both libraries load the result."""

import json

import pytest
import torch
import transformers
from click.testing import CliRunner

from tandem.cli import cli
from tandem.model import load_model
from tandem.zoo.build import DRAFT_DIR_NAME, REPORT_FILE_NAME, TARGET_DIR_NAME
from tandem.zoo.sample import SAMPLE_FILE_NAME, load_sample

FUNCTION = '''
def {name}(items, limit={n}):
    """Return the items of {name} below the limit."""
    result = []
    for item in items:
        if item < limit:
            result.append(item * {n})
    return result
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    for i in range(12):
        text = "".join(FUNCTION.format(name=f"select_{i}_{j}", n=i + j) for j in range(8))
        (corpus / f"module_{i:02d}.py").write_text(f"import os\n{text}")
    out = tmp_path_factory.mktemp("models")
    args = ["zoo", "build", "--out", str(out), "--corpus", str(corpus), "--preset", "tiny"]
    result = CliRunner().invoke(cli, [*args, "--target-steps", "4", "--draft-steps", "3", "--threads", "1"])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_writes_both_models_sample_and_report(built):
    out, output = built
    for name in (TARGET_DIR_NAME, DRAFT_DIR_NAME):
        files = {p.name for p in (out / name).iterdir()}
        assert {
            "config.json",
            "model.safetensors",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "README.md",
        } <= files
    report = json.loads((out / REPORT_FILE_NAME).read_text())
    assert report["target"]["steps"] == 4 and report["draft"]["steps"] == 3
    assert report["target"]["tokens_seen"] == 4 * 4 * 64
    assert report["command"].startswith("tandem zoo build --out ") and "--target-steps 4" in report["command"]
    assert report["corpus"]["heldout_files"] >= 1 and not report["corpus"]["is_stdlib"]
    assert {f.path for f in load_sample(out / SAMPLE_FILE_NAME)} <= set(report["corpus"]["heldout_paths"])
    assert "unigram" in output and "agreement" in output


def test_tandem_and_transformers_load_the_result_and_agree(built):
    out, _ = built
    for name in (TARGET_DIR_NAME, DRAFT_DIR_NAME):
        ours = load_model(out / name)
        hf = transformers.AutoModelForCausalLM.from_pretrained(out / name, dtype=torch.float32).eval()
        assert type(hf).__name__ == "LlamaForCausalLM"
        tokens = torch.tensor([ours.tokenizer.encode("def select(items):\n    return")])
        with torch.no_grad():
            expected = hf(tokens).logits
            actual = ours.module.logits(ours.module(tokens))
        assert torch.allclose(actual, expected, atol=1e-4, rtol=0)
        assert ours.config.max_position_embeddings == 64 and ours.eos_token_ids == (1,)


def test_same_command_builds_the_same_weights(built, tmp_path):
    out, _ = built
    report = json.loads((out / REPORT_FILE_NAME).read_text())
    corpus = report["corpus"]["root"]
    args = ["zoo", "build", "--out", str(tmp_path), "--corpus", corpus, "--preset", "tiny"]
    result = CliRunner().invoke(cli, [*args, "--target-steps", "4", "--draft-steps", "3", "--threads", "1"])
    assert result.exit_code == 0, result.output
    for name in (TARGET_DIR_NAME, DRAFT_DIR_NAME):
        assert (tmp_path / name / "model.safetensors").read_bytes() == (out / name / "model.safetensors").read_bytes()
        assert (tmp_path / name / "tokenizer.json").read_bytes() == (out / name / "tokenizer.json").read_bytes()
