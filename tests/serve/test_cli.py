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
    assert result.exit_code == 1 and "unknown optimizer 'warp-drive'" in result.output


def test_a_bad_config_file(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("max_num_seqs: many\n")
    result = invoke("--config", str(path))
    assert result.exit_code == 1 and "max_num_seqs: Input should be a valid integer" in result.output


def test_out_of_range_flags_are_usage_errors():
    result = invoke("--port", "70000")
    assert result.exit_code == 2 and "--port" in result.output


def test_every_flag_is_also_a_config_file_setting():
    """--help promises a config file takes the flags' names; keep it true."""
    from tandem.serve.cli import GATEWAY_FLAGS, serve
    from tandem.serve.config import ServerConfig

    # Gateway flags configure the deployment (its own file, --deployment), not the server.
    flags = {p.name for p in serve.params if p.name not in ("config_file", "help", *GATEWAY_FLAGS)}
    assert flags <= set(ServerConfig.model_fields)
