"""sampling_defaults: a model's `generation_config.json` -> the sampling defaults a request falls back to.

Model authors ship their intended decoding there (greedy for a code model, a temperature and top_p
for a chat model). Like vLLM's `--generation-config auto`, tandem applies those values to every
request field the client left out; what the client sends always wins. Transformers' semantics:
`do_sample: false` means greedy, whatever temperature the file also holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["sampling_defaults", "GENERATION_CONFIG_FIELDS"]

# generation_config.json field -> the sampling field it sets (OpenAI / vLLM request names).
GENERATION_CONFIG_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
_SAMPLING_ONLY = ("temperature", "top_p", "top_k", "min_p")  # meaningless when do_sample is false


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def sampling_defaults(generation_config: Mapping[str, Any]) -> dict[str, Any]:
    """The request defaults a generation config implies, keyed by request field; unusable values are skipped."""
    out: dict[str, Any] = {}
    greedy = generation_config.get("do_sample") is False
    for source, target in GENERATION_CONFIG_FIELDS.items():
        value = generation_config.get(source)
        if not _number(value) or (greedy and source in _SAMPLING_ONLY):
            continue
        if target in ("top_k", "max_tokens"):
            if value != int(value) or value < 0 or (target == "max_tokens" and value < 1):
                continue
            value = int(value)
        out[target] = value
    if greedy:
        out["temperature"] = 0.0
    return out
