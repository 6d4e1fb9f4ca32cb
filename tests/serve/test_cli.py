"""`tandem serve` refuses bad settings with one line and a non-zero exit, before loading anything."""

from __future__ import annotations

from click.testing import CliRunner

from tandem.cli import cli


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, ["serve", *args], env=env)


def test_serve_is_a_registered_command():
    result = invoke("--help")
    assert result.exit_code == 0 and "--api-key" in result.output and "--config" in result.output


def test_a_missing_model_directory(tmp_path):
    result = invoke("--model", str(tmp_path / "none"))
    assert result.exit_code == 1 and "model directory does not exist" in result.output
    assert "Traceback" not in result.output


def test_an_unknown_recipe(tiny_llama_dir):
    result = invoke("--model", str(tiny_llama_dir), "--recipe", "warp-drive")
    assert result.exit_code == 2 and "unknown optimizer 'warp-drive'" in result.output


def test_a_bad_recipe_parameter_fails_before_the_model_loads(tiny_llama_dir):
    result = invoke("--model", str(tiny_llama_dir), "--recipe", "speculative(q=3)")
    assert result.exit_code == 2 and "'speculative' has no parameter 'q'; it takes k" in result.output


def test_a_bad_config_file(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("max_num_seqs: many\n")
    result = invoke("--config", str(path))
    assert result.exit_code == 1 and "max_num_seqs: Input should be a valid integer" in result.output


def test_out_of_range_flags_are_usage_errors():
    result = invoke("--port", "70000")
    assert result.exit_code == 2 and "--port" in result.output


def test_every_flag_is_also_a_setting_of_the_config_file_and_the_environment():
    """--help promises a config file (and TANDEM_*) takes the flags' names; keep it true."""
    from tandem.cli import serve
    from tandem.edge.settings import Settings

    flags = {p.name for p in serve.params if p.expose_value} - {"config_file"}
    assert flags <= set(Settings.model_fields), flags - set(Settings.model_fields)


def test_settings_from_the_environment_and_a_did_you_mean_for_a_typo(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("max_num_seq: 4\n")
    result = invoke("--config", str(path))
    assert result.exit_code == 1 and "max_num_seq: unknown setting (did you mean max_num_seqs?)" in result.output
    result = invoke(env={"TANDEM_MAX_QUEUE": "-1"})
    assert result.exit_code == 1 and "environment variable TANDEM_MAX_QUEUE: Input should be greater" in result.output
    result = invoke(env={"TANDEM_MODEL": str(tmp_path / "none")})  # read from the environment: the preflight sees it
    assert result.exit_code == 1 and "model directory does not exist" in result.output


def test_print_deployment_schema():
    import json

    result = invoke("--print-deployment-schema")
    schema = json.loads(result.output)
    assert result.exit_code == 0 and schema["title"] == "tandem deployment file"
    assert {"variants", "policy", "router", "fallback"} <= set(schema["properties"])
    assert "recipe" in schema["$defs"]["_Variant"]["properties"]
