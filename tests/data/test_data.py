"""Package data: the trace and the GPU timings ship inside tandem, with their licences beside them."""

from pathlib import Path

import pytest

import tandem.data
from tandem.data import ATTRIBUTION, CONVERSATION_TRACE, SPLITWISE_TIMINGS, data_path


def test_bundled_files_are_found_inside_the_package():
    package = Path(tandem.data.__file__).parent
    for name in (CONVERSATION_TRACE, SPLITWISE_TIMINGS):
        path = data_path(name)
        assert path.is_file() and path.parent == package and "shared" not in path.parts
    assert data_path(CONVERSATION_TRACE).read_text().startswith("TIMESTAMP,ContextTokens,GeneratedTokens")


def test_the_notice_carries_each_licence_and_attribution():
    notice = (Path(tandem.data.__file__).parent / "NOTICE.md").read_text()
    assert "CC-BY 4.0" in notice and "MIT License" in notice and "Pratyush Patel" in notice
    assert "Splitwise" in ATTRIBUTION[CONVERSATION_TRACE] and "MIT" in ATTRIBUTION[SPLITWISE_TIMINGS]


def test_an_unknown_file_is_a_clear_error():
    with pytest.raises(ValueError, match="no bundled data file"):
        data_path("nope.csv")


def test_nothing_under_src_reads_the_shared_folder():
    src = Path(tandem.data.__file__).parents[1]
    offenders = [p for p in src.rglob("*.py") if '"shared"' in p.read_text() or "'shared'" in p.read_text()]
    assert offenders == []
