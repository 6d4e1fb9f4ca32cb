"""`tandem zoo`: registered under the main command, with a clean error for an unusable corpus."""

from click.testing import CliRunner

from tandem.cli import cli
from tandem.zoo.cli import _command_line


def test_zoo_build_is_a_tandem_command():
    result = CliRunner().invoke(cli, ["zoo", "build", "--help"])
    assert result.exit_code == 0
    assert "--out" in result.output and "--target-steps" in result.output and "models/" in result.output


def test_a_corpus_without_enough_files_is_a_one_line_error(tmp_path):
    (tmp_path / "only.py").write_text("x = 1\n")
    result = CliRunner().invoke(cli, ["zoo", "build", "--out", str(tmp_path / "out"), "--corpus", str(tmp_path)])
    assert result.exit_code == 1
    assert "need at least 2 Python files" in result.output and "Traceback" not in result.output


def test_recorded_command_lists_only_what_differs_from_the_defaults():
    defaults = {"out": "models/", "seed": 0, "preset": "bundled", "target_steps": None}
    params = {"out": "models/", "seed": 0, "preset": "tiny", "target_steps": 5}
    assert _command_line(params, defaults) == "tandem zoo build --out models/ --preset tiny --target-steps 5"
