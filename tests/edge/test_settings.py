"""Settings: defaults <- YAML/JSON file <- TANDEM_* variables <- flags; errors name where the bad value came
from, and an unknown name gets a "did you mean" suggestion."""

from __future__ import annotations

import pytest

from tandem.edge.settings import GATEWAY_MODE_FIELDS, ConfigError, Settings, load_settings, settings_environment


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("TANDEM_"):
            monkeypatch.delenv(name)


def test_defaults_read_nothing():
    config = load_settings()
    assert config == Settings()
    assert (config.host, config.port, config.api_key, config.recipe, config.model) == (
        "127.0.0.1",
        8000,
        None,
        None,
        None,
    )
    assert not config.gateway_mode


def test_a_yaml_file_is_overridden_by_flags_that_were_given(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("port: 9000\nmax-num-seqs: 4\nrecipe: bf16\nshutdown_timeout: 5\n")
    config = load_settings(path, {"port": 9100, "recipe": None})
    assert config.port == 9100  # the flag wins
    assert config.recipe == "bf16"  # a flag left at None does not erase the file's value
    assert config.max_num_seqs == 4 and config.shutdown_timeout == 5.0


def test_environment_variables_sit_between_the_file_and_the_flags(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("max_num_seqs: 4\nport: 9000\nregions: [eu, us]\n")
    environ = {
        "TANDEM_MAX_NUM_SEQS": "8",
        "TANDEM_PORT": "9200",
        "TANDEM_REPLICA_PORTS": "9000-9099",
        "TANDEM_ACCESS_LOG": "true",
        "TANDEM_CACHE": "/tmp/elsewhere",  # not a setting: left alone
    }
    config = load_settings(path, {"port": 9300}, environ)
    assert config.max_num_seqs == 8 and config.port == 9300 and config.access_log is True
    assert config.replica_ports == (9000, 9099) and config.regions == ["eu", "us"] and config.gateway_mode
    assert load_settings(path, environ={"TANDEM_REGIONS": "eu, asia"}).regions == ["eu", "asia"]


def test_the_process_environment_is_read_by_default(monkeypatch):
    monkeypatch.setenv("TANDEM_MAX_QUEUE", "3")
    assert load_settings().max_queue == 3


def test_the_config_file_can_come_from_the_environment(tmp_path):
    path = tmp_path / "gateway.json"
    path.write_text('{"replicas_max": 3, "api_key": "k"}')
    config = load_settings(environ={"TANDEM_CONFIG": str(path)})
    assert config.replicas_max == 3 and config.api_key == "k" and config.gateway_mode


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("prot: 9000\n", "prot: unknown setting (did you mean port?)"),
        ("max_num_seq: 4\n", "max_num_seq: unknown setting (did you mean max_num_seqs?)"),
        ("colour: blue\n", "colour: unknown setting (known: model, recipe"),
        ("port: nine\n", "port: Input should be a valid integer"),
        ("max_num_seqs: 0\n", "max_num_seqs: Input should be greater than or equal to 1"),
        ("dtype: float16\n", "dtype: Input should be 'float32' or 'bfloat16'"),
        ("replica_ports: 9100-9000\n", "replica_ports: Value error, expected 1 <= low <= high"),
        ("- port\n", "must be a mapping of settings, got list"),
        ("port: [\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_file_and_the_field(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert expected.replace("Value error, ", "") in str(info.value) and str(path) in str(info.value)


def test_bad_environment_variables_are_named():
    with pytest.raises(
        ConfigError, match=r"TANDEM_MAX_NUM_SEQ: unknown setting \(did you mean TANDEM_MAX_NUM_SEQS\?\)"
    ):
        load_settings(environ={"TANDEM_MAX_NUM_SEQ": "8"})
    with pytest.raises(ConfigError, match="environment variable TANDEM_PORT: Input should be a valid integer"):
        load_settings(environ={"TANDEM_PORT": "abc"})


def test_a_bad_flag_value_does_not_blame_the_file(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("port: 9000\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, {"max_queue": -1})
    assert str(info.value).startswith("--max-queue:")


def test_a_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_settings(tmp_path / "none.yaml")


def test_the_gateways_own_variables_are_not_passed_on():
    environ = {"TANDEM_REPLICAS_MAX": "4", "TANDEM_CONFIG": "g.yaml", "TANDEM_CACHE": "/c", "PATH": "/bin"}
    assert set(settings_environment(environ)) == {"TANDEM_REPLICAS_MAX", "TANDEM_CONFIG"}
    assert set(GATEWAY_MODE_FIELDS) <= set(Settings.model_fields)


def test_a_backend_or_a_ray_address_alone_makes_a_gateway():
    assert {"backend", "ray_address"} <= set(GATEWAY_MODE_FIELDS)
    assert load_settings(flags={"backend": "ray"}).gateway_mode
    config = load_settings(environ={"TANDEM_RAY_ADDRESS": "10.0.0.1:6379"})
    assert config.gateway_mode and config.ray_address == "10.0.0.1:6379"
    with pytest.raises(ConfigError, match="--backend"):
        load_settings(flags={"backend": "kubernetes"})


def test_the_resume_bound_comes_from_a_flag_a_variable_or_the_file(tmp_path):
    assert load_settings().max_resumes == 2
    assert load_settings(environ={"TANDEM_MAX_RESUMES": "0"}).max_resumes == 0  # 0: never resume
    assert load_settings(flags={"max_resumes": 5}).max_resumes == 5
    with pytest.raises(ConfigError, match="max-resumes"):
        load_settings(flags={"max_resumes": -1})
