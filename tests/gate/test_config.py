"""The deployment file's gate block: defaults, nesting, and errors that name the field."""

import pytest

from tandem.gate.config import GateConfig, GateConfigError, GateSettings, parse_gate_settings


def test_defaults_and_nesting():
    config = parse_gate_settings({"candidate": "fast"})
    assert config == GateConfig(candidate="fast")
    config = parse_gate_settings({
        "candidate": "fast", "fraction": 0.5, "auto_promote": False,
        "min_samples": {"latency": 200}, "tolerances": {"latency_p95": 0.2, "error_rate": 0.0},
        "accuracy": {"lossless": True}, "shadow": {"queue": 8},
    })  # fmt: skip
    assert (config.fraction, config.auto_promote, config.min_latency_samples, config.min_accuracy_samples) == (
        0.5, False, 200, 30,
    )  # fmt: skip
    assert config.latency_p95_tolerance == 0.2 and config.max_error_rate == 0.0 and config.lossless
    assert config.shadow_queue == 8 and config.shadow_concurrency == 4


@pytest.mark.parametrize(
    "raw, message",
    [
        ({}, "gate.candidate: required"),
        ({"candidate": "f", "fraction": 0}, "gate.fraction: Input should be greater than 0"),
        ({"candidate": "f", "tolerances": {"latency": 0.1}}, "gate.tolerances.latency: unknown field"),
        ({"candidate": "f", "min_samples": {"latency": 1}}, "gate.min_samples.latency: Input should be greater"),
        ({"candidate": "f", "confidence": 1.0}, "gate.confidence: Input should be less than 1"),
        ([], "gate: must be a mapping of fields (got list)"),
    ],
)
def test_errors_name_the_field(raw, message):
    with pytest.raises(GateConfigError) as err:
        parse_gate_settings(raw)
    assert str(err.value).startswith(message)


def test_the_settings_model_is_a_strict_pydantic_block_the_deployment_file_can_nest():
    assert GateSettings.model_config["extra"] == "forbid" and GateSettings.model_config["frozen"]
