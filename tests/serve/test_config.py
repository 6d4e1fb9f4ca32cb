"""ServerConfig: defaults <- YAML/JSON file <- flags, with errors naming the file, the field and the problem."""

from __future__ import annotations

import pytest

from tandem.serve.config import ConfigError, ServerConfig, build_config, load_config_file


def test_defaults():
    config = build_config()
    assert config == ServerConfig()
    assert (config.host, config.port, config.api_key, config.recipe, config.model) == (
        "127.0.0.1",
        8000,
        None,
        None,
        None,
    )


def test_a_yaml_file_is_overridden_by_flags_that_were_given(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("port: 9000\nmax-num-seqs: 4\nrecipe: bf16\nshutdown_timeout: 5\n")
    config = build_config(path, {"port": 9100, "recipe": None})
    assert config.port == 9100  # the flag wins
    assert config.recipe == "bf16"  # a flag left at None does not erase the file's value
    assert config.max_num_seqs == 4 and config.shutdown_timeout == 5.0


def test_a_json_file(tmp_path):
    path = tmp_path / "serve.json"
    path.write_text('{"api_key": "k", "max_queue": 0}')
    assert load_config_file(path) == {"api_key": "k", "max_queue": 0}
    assert build_config(path).max_queue == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("prot: 9000\n", "prot: unknown setting (known: model, recipe"),
        ("port: '9000'\n", "port: Input should be a valid integer"),
        ("max_num_seqs: 0\n", "max_num_seqs: Input should be greater than or equal to 1"),
        ("dtype: float16\n", "dtype: Input should be 'float32' or 'bfloat16'"),
        ("- port\n", "must hold a mapping of settings, got list"),
        ("port: [\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_file_and_the_field(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        build_config(path)
    assert expected in str(info.value) and str(path) in str(info.value)


def test_a_bad_flag_value_does_not_blame_the_file(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("port: 9000\n")
    with pytest.raises(ConfigError) as info:
        build_config(path, {"max_queue": -1})
    assert str(info.value).startswith("max_queue:")


def test_a_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        build_config(tmp_path / "none.yaml")
