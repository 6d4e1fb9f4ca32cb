"""read_trace: the one trace CSV reader; every bad file is a ValueError naming the file and the fault."""

import pytest

from tandem.data import CONVERSATION_TRACE, data_path
from tandem.data.traces import read_trace


def test_the_bundled_trace_reads_with_and_without_timestamps():
    timed = read_trace(data_path(CONVERSATION_TRACE))
    lengths = read_trace(data_path(CONVERSATION_TRACE), timed=False)
    assert len(timed) == len(lengths) > 1000
    assert [row[1:] for row in timed] == [row[1:] for row in lengths] and all(row[0] == 0.0 for row in lengths)


def test_lengths_alone_are_enough_for_a_workload(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("ContextTokens,GeneratedTokens\n100,20\n7,0\n")
    assert read_trace(path, timed=False) == [(0.0, 100, 20), (0.0, 7, 0)]
    with pytest.raises(ValueError, match="missing column\\(s\\) TIMESTAMP"):
        read_trace(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such trace file"),
        ("dir", "not a file"),
        (b"\xff\xfe\x00binary", "not UTF-8 text"),
        ("", "missing column\\(s\\) ContextTokens, GeneratedTokens .*found nothing"),
        ("prompt,output\n1,2\n", "missing column\\(s\\) ContextTokens, GeneratedTokens .*found prompt,output"),
        ("ContextTokens,GeneratedTokens\n5,x\n", ":2: bad row"),
        ("ContextTokens,GeneratedTokens\n5,6\n5\n", ":3: bad row"),
        ("ContextTokens,GeneratedTokens\n-5,6\n", ":2: token counts must be >= 0"),
        ("ContextTokens,GeneratedTokens\n", "the trace has no requests"),
    ],
)
def test_a_missing_or_malformed_trace_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "trace.csv"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=f"{path}.*{message}"):
        read_trace(path, timed=False)


def test_a_mooncake_jsonl_trace_reads_milliseconds_as_seconds(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1]}\n'
        '\n{"timestamp": 1500, "input_length": 512, "output_length": 0, "hash_ids": [0]}\n'
    )
    assert read_trace(path) == [(0.0, 40160, 6), (1.5, 512, 0)]
    assert read_trace(path, timed=False) == [(0.0, 40160, 6), (0.0, 512, 0)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"timestamp": 0, "input_length": 5}\n', ":1: missing key"),
        ("not json\n", ":1: not a JSON object"),
        ('{"timestamp": 0, "input_length": -1, "output_length": 1}\n', "token counts"),
        ("", "no requests"),
    ],
)
def test_a_bad_jsonl_trace_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_trace(path)


def test_the_shared_mooncake_trace_reads():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "shared" / "data" / "mooncake_synthetic_trace.jsonl"
    if not path.is_file():
        pytest.skip("../shared/data is not beside this checkout")
    rows = read_trace(path)
    assert len(rows) == 3993 and 1000 < rows[-1][0] < 1100  # 17 minutes
