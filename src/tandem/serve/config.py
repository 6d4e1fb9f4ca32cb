"""ServerConfig: every setting of `tandem serve` in one validated object.

Values come from three places, later ones winning: the defaults here, a YAML or JSON file
(`--config FILE`), and command-line flags (or TANDEM_API_KEY). A bad value anywhere is a
ConfigError naming the file (if any), the field and what is wrong, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["ConfigError", "ServerConfig", "load_config_file", "build_config"]


class ConfigError(ValueError):
    """A configuration file or value is unusable; the message names the field and the problem."""


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # What to serve.
    model: str | None = None  # HF model directory; None serves the bundled default model
    recipe: str | None = None  # optimizer recipe; None uses tandem.optimize.defaults.DEFAULT_RECIPE
    served_model_name: str | None = None  # the name clients put in "model"; default: the model directory's name
    dtype: Literal["float32", "bfloat16"] = "float32"

    # Where and for whom.
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = Field(None, min_length=1)

    # Engine sizing (see tandem.engine.EngineConfig).
    max_model_len: int | None = Field(None, ge=2)
    kv_cache_tokens: int = Field(32768, ge=2)
    max_num_seqs: int = Field(64, ge=1)
    max_prefill_tokens: int = Field(512, ge=1)
    threads: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = True  # reuse the KV of identical prompt prefixes

    # Admission and limits.
    max_queue: int = Field(256, ge=0)  # sequences allowed to wait for a KV slot before 429
    max_body_bytes: int = Field(1 << 20, ge=256)  # larger request bodies get 413
    max_n: int = Field(16, ge=1)  # upper bound on `n` (choices per prompt)
    retry_after_s: int = Field(1, ge=0)  # the Retry-After header sent with 429
    shutdown_timeout: float = Field(30.0, ge=0)  # on SIGTERM, in-flight requests get this long to finish

    # Logging.
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False  # one line per request; off by default (a load test writes thousands)


def _describe(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            known = ", ".join(ServerConfig.model_fields)
            lines.append(f"{source}{field}: unknown setting (known: {known})")
        else:
            lines.append(f"{source}{field}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(lines)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping of ServerConfig fields (not validated yet)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror or exc})") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise ConfigError(f"{path}: not valid {kind} ({' '.join(str(exc).split())})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must hold a mapping of settings, got {type(raw).__name__}")
    # Accept the flags' spelling too (max-num-seqs), so a file can be written from --help.
    return {str(k).replace("-", "_"): v for k, v in raw.items()}


def build_config(file: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> ServerConfig:
    """Defaults <- file <- overrides (entries whose value is None are 'not given' and skipped)."""
    values: dict[str, Any] = {}
    source = ""
    if file is not None:
        values.update(load_config_file(file))
        source = f"{file}: "
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    values.update(given)
    try:
        return ServerConfig.model_validate(values)
    except ValidationError as exc:
        # Name the file only when the bad field came from it.
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        raise ConfigError(_describe(exc, source if bad - set(given) else "")) from None
