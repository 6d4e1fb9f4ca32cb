"""Hostile configs are refused before anything is allocated: fast, naming the field, memory flat.

Each config is loaded in one child process (so its peak memory is its own) that reports, per config,
the error and the seconds it took, and at the end its peak resident memory over the baseline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from timing import within

from tandem.model import load_config
from tandem.model.checkpoint import check_checkpoint, expected_tensors
from tandem.model.weights import checkpoint_files

# config change -> what the error must say (None: it must load)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}
HOSTILE = {
    "layers far over the limit": ({"num_hidden_layers": 1_000_000}, "'num_hidden_layers' = 1000000 is over the limit"),
    "more layers than the files hold": (
        {"num_hidden_layers": 1000}, "'num_hidden_layers' = 1000, but the checkpoint holds 2"),
    "hidden size far over the limit": ({"hidden_size": 1_000_000_000}, "'hidden_size' = 1000000000 is over the limit"),
    "a hidden size the files do not hold": (
        {"hidden_size": 8192, "head_dim": 16}, "field 'hidden_size' = 8192 does not match"),
    "a vocabulary the files do not hold": ({"vocab_size": 2_000_000}, "field 'vocab_size' = 2000000 does not match"),
    "an MLP the files do not hold": (
        {"intermediate_size": 500_000}, "field 'intermediate_size' = 500000 does not match"),
    "heads the files do not hold": (
        {"num_attention_heads": 512, "num_key_value_heads": 512, "head_dim": 16},
        "field 'num_attention_heads x head_dim' = 8192 does not match"),
    "positions far over the limit": ({"max_position_embeddings": 40_000_000}, "is over the limit of 16777216"),
    "ten million positions (tables for the served context only)": ({"max_position_embeddings": 10_000_000}, None),
    "a NaN epsilon": ({"rms_norm_eps": float("nan")}, "'rms_norm_eps' must be a finite number"),
    "a rope ramp that divides by zero": (
        {"rope_scaling": None, "rope_parameters": {**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 4.0}},
        "high_freq_factor' must be above"),
    "an infinite rope factor": (
        {"rope_scaling": None, "rope_parameters": {"rope_type": "linear", "factor": float("inf")}}, "positive finite"),
    "an end-of-text id outside the vocabulary": ({"eos_token_id": [1, 10**9]}, "'eos_token_id' must be token ids"),
    "a zero sliding window": ({"sliding_window": 0}, "'sliding_window' must be positive"),
}  # fmt: skip

CHILD = r"""
import json, sys, time
from pathlib import Path
from tandem.model import ModelLoadError, load_model

def rss(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

load_model(sys.argv[1])  # the untouched model: imports and allocator warmed up
baseline = rss("VmHWM")
out = {}
for name, path in json.loads(sys.argv[2]).items():
    started = time.monotonic()
    try:
        model = load_model(path)
        out[name] = {"error": None, "s": time.monotonic() - started, "positions": model.module.rope_cos.shape[0]}
    except ModelLoadError as exc:
        out[name] = {"error": str(exc), "s": time.monotonic() - started}
print(json.dumps({"results": out, "peak_growth": rss("VmHWM") - baseline}))
"""


@pytest.mark.slow
def test_each_hostile_config_is_refused_fast_naming_the_field_with_flat_memory(tiny_llama_dir, tmp_path):
    paths = {}
    for i, (name, (changes, _)) in enumerate(HOSTILE.items()):
        path = tmp_path / f"m{i}"
        shutil.copytree(tiny_llama_dir, path)
        raw = json.loads((path / "config.json").read_text())
        raw.update(changes)
        (path / "config.json").write_text(json.dumps(raw))  # NaN and Infinity as Python writes them
        paths[name] = str(path)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_llama_dir), json.dumps(paths)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    for name, (_, expected) in HOSTILE.items():
        got = report["results"][name]
        if expected is None:
            assert got["error"] is None and got["positions"] == 2048, got  # not 10 million rows
        else:
            assert got["error"] is not None and expected in got["error"], (name, got)
            assert "config.json" in got["error"], got
        assert got["s"] < within(1.0), (name, got)
    assert report["peak_growth"] < 64 << 20, report["peak_growth"]  # no config allocated what it promised


def test_truncated_and_inconsistent_headers_are_corrupt_files(tiny_llama_dir, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, model)
    config = load_config(model)
    files = checkpoint_files(model)
    found = check_checkpoint(config, files)
    assert set(found) >= set(expected_tensors(config))
    data = files[0].read_bytes()
    files[0].write_bytes(data[:-100])  # the last tensor's bytes end past the file
    with pytest.raises(Exception, match="corrupt or truncated safetensors file .*lie outside the file"):
        check_checkpoint(config, files)
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [header[name]["shape"][0] * 2, *header[name]["shape"][1:]]
    text = json.dumps(header).encode()
    files[0].write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length :])
    with pytest.raises(Exception, match="cannot hold a"):
        check_checkpoint(config, files)
