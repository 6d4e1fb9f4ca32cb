"""The `tandem` command: generate streams a completion; bad input exits non-zero with a message."""

import subprocess
import sys

from click.testing import CliRunner

from tandem.cli import cli


def test_generate_streams_prompt_and_completion(tiny_llama_dir):
    result = CliRunner().invoke(
        cli, ["generate", "--model", str(tiny_llama_dir), "--prompt", "def add", "--max-tokens", "8"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("def add") and len(result.output) > len("def add\n")


def test_generate_is_deterministic_with_a_seed(tiny_llama_dir):
    args = ["generate", "--model", str(tiny_llama_dir), "--prompt", "x", "--temperature", "1", "--seed", "5"]
    first, second = CliRunner().invoke(cli, args), CliRunner().invoke(cli, args)
    assert first.exit_code == 0 and first.output == second.output


def test_missing_model_is_a_clear_error_not_a_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "generate", "--model", str(tmp_path / "none"), "--prompt", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "model directory does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_prompt_beyond_context_is_a_clear_error(tiny_llama_dir):
    result = CliRunner().invoke(cli, ["generate", "--model", str(tiny_llama_dir), "--prompt", "x " * 400])
    assert result.exit_code == 1 and "context is 256 tokens" in result.output


def test_out_of_range_option_is_rejected(tiny_llama_dir):
    result = CliRunner().invoke(cli, ["generate", "--model", str(tiny_llama_dir), "--prompt", "x", "--top-p", "2"])
    assert result.exit_code == 2 and "top-p" in result.output


def test_help_imports_neither_torch_nor_the_optimizers():
    code = (
        "import sys\n"
        "from tandem.cli import cli\n"
        "try:\n    cli(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('tandem.optimize', 'tandem.engine')))\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout and "serve" in proc.stdout and "bench" in proc.stdout


def test_the_lazy_commands_help_is_the_commands_own():
    import importlib

    from tandem.cli import LAZY_COMMANDS

    for name, (where, short_help) in LAZY_COMMANDS.items():
        module, _, attribute = where.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert command.name == name and command.get_short_help_str(limit=200) == short_help
