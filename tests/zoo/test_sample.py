"""The committed held-out sample: whole lines from held-out files, within its byte budget, round-tripped."""

import json

from tandem.zoo.corpus import SourceFile
from tandem.zoo.sample import heldout_sample, load_sample, save_sample


def _files():
    return [SourceFile(f"m{i}.py", "".join(f"line_{i}_{j} = {j}\n" for j in range(200))) for i in range(10)]


def test_sample_takes_whole_leading_lines_within_budgets():
    sample = heldout_sample(_files(), total_bytes=5000, per_file_bytes=1500)
    sizes = [len(f.text.encode()) for f in sample]
    assert all(s <= 1500 for s in sizes) and 4800 <= sum(sizes) <= 5000
    for part, full in zip(sample, _files(), strict=False):
        assert part.path == full.path and full.text.startswith(part.text) and part.text.endswith("\n")


def test_save_and_load_round_trip_with_provenance(tmp_path):
    sample = heldout_sample(_files(), total_bytes=3000)
    path = tmp_path / "sample.json"
    save_sample(sample, path, heldout_list_sha256="ab" * 32)
    assert load_sample(path) == sample
    payload = json.loads(path.read_text())
    assert "Python Software Foundation" in payload["license"] and payload["heldout_list_sha256"] == "ab" * 32
