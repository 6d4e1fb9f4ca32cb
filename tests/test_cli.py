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
    base = ["generate", "--model", str(tiny_llama_dir), "--prompt", "x", "--max-tokens", "12"]

    def run(*extra: str) -> str:
        result = CliRunner().invoke(cli, [*base, *extra])
        assert result.exit_code == 0, result.output
        return result.output

    sampled = ["--temperature", "1"]
    first, again = run(*sampled, "--seed", "5"), run(*sampled, "--seed", "5")
    others = {run(*sampled, "--seed", str(seed)) for seed in (6, 7)}
    assert first == again  # one seed repeats
    assert first not in others and len(others) == 2  # it is the seed that fixes the draw: others differ
    assert first != run("--temperature", "0")  # and it did sample (greedy would repeat without a seed)


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


def test_a_bad_recipe_is_one_line_and_exit_2_before_anything_loads():
    for command in (["profile", "--recipe", "speculative(q=3)"], ["bench", "--recipes", "int9", "--requests", "1"]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.output


def test_optimizers_lists_parameters():
    result = CliRunner().invoke(cli, ["optimizers"], terminal_width=200)
    assert result.exit_code == 0
    assert "k: int = 3" in result.output and "lm_head: bool = True" in result.output


def test_generate_takes_the_prompt_as_an_argument_or_on_stdin(tiny_llama_dir):
    args = ["generate", "--model", str(tiny_llama_dir), "--max-tokens", "6"]
    positional = CliRunner().invoke(cli, [*args, "def add"])
    piped = CliRunner().invoke(cli, args, input="def add")
    flag = CliRunner().invoke(cli, [*args, "--prompt", "def add"])
    assert positional.exit_code == piped.exit_code == flag.exit_code == 0, positional.output
    assert positional.output == piped.output == flag.output  # greedy by default, whichever way the prompt came


def test_generate_without_a_prompt_is_a_usage_error(tiny_llama_dir):
    result = CliRunner().invoke(cli, ["generate", "--model", str(tiny_llama_dir)], input="")
    assert result.exit_code == 2 and "no prompt" in result.output


def test_generate_with_a_recipe_runs_the_recipes_model(tiny_llama_dir, monkeypatch):
    import tandem.engine
    from tandem.model import load_model

    engines = []

    class RecordedEngine(tandem.engine.Engine):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            engines.append(self)

    monkeypatch.setattr(tandem.engine, "Engine", RecordedEngine)
    prompt = "a b c a b c a b c a b c"  # repeats: the n-gram speculator finds its suffix and proposes
    args = ["generate", "--model", str(tiny_llama_dir), "--max-tokens", "16", "--recipe", "int8+ngram", prompt]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(prompt) and len(result.output) > len(prompt) + 1
    (engine,) = engines
    assert engine.recipe == "int8+ngram" and [name for name, _ in engine.optimized.applied] == ["int8", "ngram"]
    assert engine.model.weight_bytes < 0.75 * load_model(tiny_llama_dir).weight_bytes  # int8 weights ran
    assert engine.speculator is not None and engine.num_drafted_tokens > 0  # and drafts were verified


def test_generate_with_chat(tiny_llama_dir):
    base = ["generate", "--model", str(tiny_llama_dir), "--max-tokens", "6", "def add"]
    chat = CliRunner().invoke(cli, [*base, "--chat"])
    assert chat.exit_code == 0, chat.output
    assert not chat.output.startswith("def add")  # the reply only, not the templated prompt


def test_generate_follows_the_models_generation_config(tiny_llama_dir, tmp_path):
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    (model / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": 3}))
    from tandem.model import load_model

    tokenizer = load_model(model).tokenizer
    # baseline: a random tiny model's int8 argmax can be a token whose bytes re-encode as more tokens
    args = ["generate", "--model", str(model), "--recipe", "baseline", "x"]
    result = CliRunner().invoke(cli, [*args, "--max-tokens", "3"])
    default = CliRunner().invoke(cli, args)
    assert default.exit_code == 0 and default.output == result.output  # 3 tokens, greedy, from the file
    assert len(tokenizer.encode(default.output[1:].rstrip("\n"), add_special_tokens=False)) <= 3


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


def test_generate_runs_the_recipe_tandem_serve_serves_by_default(tiny_llama_dir):
    from tandem.optimize.defaults import DEFAULT_RECIPE, recipe_or_default
    from tandem.serve.served import resolve_recipe

    assert recipe_or_default(None) == resolve_recipe(None) == DEFAULT_RECIPE
    args = ["generate", "--model", str(tiny_llama_dir), "--prompt", "def add", "--max-tokens", "8"]
    default = CliRunner().invoke(cli, args)
    named = CliRunner().invoke(cli, [*args, "--recipe", DEFAULT_RECIPE])
    assert default.exit_code == named.exit_code == 0 and default.output == named.output


def test_serve_max_resumes_reaches_the_gateway_settings(monkeypatch, tmp_path):
    import tandem.gateway.cli

    seen = []
    monkeypatch.setattr(tandem.gateway.cli, "serve_gateway", lambda settings: seen.append(settings) or 0)
    result = CliRunner().invoke(cli, ["serve", "--deployment", str(tmp_path / "d.yaml"), "--max-resumes", "5"])
    assert result.exit_code == 0, result.output
    assert seen[0].max_resumes == 5
    bad = CliRunner().invoke(cli, ["serve", "--deployment", str(tmp_path / "d.yaml"), "--max-resumes", "-1"])
    assert bad.exit_code == 2 and "--max-resumes" in bad.output
