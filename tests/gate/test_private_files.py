"""The gate's files (pairs, decisions, reports) are owner-only, whatever the umask and whatever mode an
older file had."""

from __future__ import annotations

import os

from tandem.gate.private_files import open_private, write_private


def test_new_and_existing_files_end_up_0600_and_keep_their_content(tmp_path):
    old_umask = os.umask(0)
    try:
        appended, replaced = tmp_path / "gate-pairs.jsonl", tmp_path / "report.html"
        appended.write_text("old\n")
        appended.chmod(0o644)  # written by an older version
        with open_private(appended) as out:
            out.write("new\n")
        write_private(replaced, "first")
        write_private(replaced, "second")
    finally:
        os.umask(old_umask)
    assert appended.read_text() == "old\nnew\n" and replaced.read_text() == "second"
    assert {appended.stat().st_mode & 0o777, replaced.stat().st_mode & 0o777} == {0o600}
