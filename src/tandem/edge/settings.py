"""Settings: every setting of `tandem serve`, the single-replica server's and the gateway's, in one model.

Values come from four places, later ones winning: the defaults here, a YAML or JSON file
(`--config FILE` or TANDEM_CONFIG), TANDEM_* environment variables (TANDEM_MAX_NUM_SEQS=8,
read by pydantic-settings), and command-line flags. `load_settings` merges them and turns every
problem into a ConfigError naming where the bad value came from (the file, the variable or the
flag) and, for an unknown name, the closest known one ("did you mean max_num_seqs?").

`Settings(...)` itself reads nothing: tests and code build it from plain values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from tandem.edge.files import ConfigError, describe_errors, load_mapping, suggest

__all__ = [
    "ENV_PREFIX",
    "GATEWAY_MODE_FIELDS",
    "ConfigError",
    "Settings",
    "load_settings",
    "parse_port_range",
    "settings_environment",
    "settings_variables",
]

ENV_PREFIX = "TANDEM_"
# Any of these, from any source, makes `tandem serve` a gateway in front of replicas.
GATEWAY_MODE_FIELDS = (
    "deployment", "replicas_min", "replicas_max", "policy", "fallback", "regions", "backend", "ray_address", "shadow",
)  # fmt: skip


def parse_port_range(value: Any) -> tuple[int, int] | None:
    """'9000-9099' (or [9000, 9099]) -> (9000, 9099); ports in 1..65535, low <= high."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        low, sep, high = value.partition("-")
        if not sep or not low.strip().isdigit() or not high.strip().isdigit():
            raise ValueError(f"expected a port range such as 9000-9099, got {value!r}")
        value = (int(low), int(high))
    low, high = value
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"expected 1 <= low <= high <= 65535, got {low}-{high}")
    return int(low), int(high)


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # What to serve.
    model: str | None = None  # HF model directory; None serves the bundled default model
    recipe: str | None = None  # optimizer recipe; None: the replica's default (tandem.optimize.defaults)
    served_model_name: str | None = None  # the name clients put in "model"; default: the model directory's name
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Where a request's omitted sampling fields come from (vLLM's --generation-config): "auto", the
    # model's generation_config.json (its temperature, top_p, top_k, min_p, repetition_penalty,
    # max_new_tokens); "vllm", the OpenAI API's defaults (temperature 1, no cuts, no penalty).
    generation_config: Literal["auto", "vllm"] = "auto"
    # How tool_choice "auto" reads tool calls out of the model's text (vLLM's --tool-call-parser);
    # None: "auto" is refused, "required" and named functions work regardless (tandem.serve.tools).
    tool_call_parser: Literal["hermes"] | None = None

    # Where and for whom.
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = Field(None, min_length=1)

    # Engine sizing (see tandem.engine.EngineConfig).
    max_model_len: int | None = Field(None, ge=2)
    kv_cache_tokens: int = Field(32768, ge=2)
    max_num_seqs: int = Field(64, ge=1)
    max_prefill_tokens: int = Field(512, ge=1)
    enable_prefix_caching: bool = True  # reuse the KV of identical prompt prefixes
    threads: int | None = Field(None, ge=1)

    # Admission and limits.
    max_queue: int = Field(256, ge=0)  # sequences allowed to wait for a KV slot before 429
    max_body_bytes: int = Field(1 << 20, ge=256)  # larger request bodies get 413
    max_n: int = Field(16, ge=1)  # upper bound on `n` (choices per prompt)
    # The most of a replica's running slots and queue one request (prompts x n) may hold: more is a 400
    # naming the bound; while others wait, its choices hold at most this share of the running slots.
    max_request_share: float = Field(0.25, gt=0, le=1)
    retry_after_s: int = Field(1, ge=0)  # the Retry-After header sent with 429
    shutdown_timeout: float = Field(30.0, ge=0)  # on SIGTERM, in-flight requests get this long to finish

    # Connections (both apps; see tandem.edge.connections).
    max_connections: int = Field(4096, ge=1)  # open at once; past it the oldest idle or half-sent ones close
    header_timeout: float = Field(10.0, gt=0)  # a request's headers must arrive within this, else the connection closes
    body_timeout: float = Field(30.0, gt=0)  # a request's whole body must arrive within this, else 408
    keep_alive_timeout: float = Field(5.0, gt=0)  # an idle keep-alive connection closes after this (uvicorn's)
    max_header_bytes: int = Field(16384, ge=1024)  # request line and headers together (h11's incomplete-event limit)
    backlog: int = Field(4096, ge=1)  # connections the kernel queues before they are accepted (capped by somaxconn)

    # Logging.
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False  # one line per request; off by default (a load test writes thousands)
    # /metrics family names: tandem:<name>, or vllm:<name> so vLLM dashboards and autoscaling rules read them.
    metrics_prefix: Literal["tandem", "vllm"] = "tandem"

    # A replica in a fleet: set by the gateway that starts it (reported on GET /load).
    replica_id: str | None = None
    replica_region: str = "local"
    replica_variant: str | None = None  # default: the recipe served
    parent_pid: int | None = Field(None, ge=1)  # exit when this process (the gateway) is gone
    # The gateway's per-fleet secret, which this replica then requires on everything but /health and
    # /ready. Only ever from the environment (TANDEM_FLEET_SECRET): a flag would show in `ps`.
    fleet_secret: SecretStr | None = None

    # Gateway mode (any of GATEWAY_MODE_FIELDS): a router and an autoscaler in front of replicas (local, or on Ray).
    deployment: str | None = None  # the deployment file (YAML) of variants
    replicas_min: int | None = Field(None, ge=0)
    replicas_max: int | None = Field(None, ge=1)
    policy: Literal["hpa", "kpa", "capacity"] | None = None
    fallback: str | None = None  # recipe (or variant) that re-runs requests failed on the primary
    regions: Annotated[list[str] | None, NoDecode] = None  # "eu,us" in a flag or a variable
    log_dir: str | None = None  # replica logs; default: $TANDEM_CACHE/logs/gateway-<time>-<pid>
    replica_ports: Annotated[tuple[int, int] | None, NoDecode] = None  # "9000-9099"; default: any free port
    queue_timeout: float = Field(60.0, gt=0)  # how long a request waits at the gateway for a replica
    first_byte_timeout: float = Field(30.0, gt=0)  # a stream's first byte (see tandem.gateway.liveness)
    stream_idle_timeout: float = Field(30.0, gt=0)  # the longest pause between a stream's chunks
    max_resumes: int = Field(2, ge=0)  # a stream that breaks mid-way is resumed elsewhere at most this often
    backend: Literal["local", "ray"] | None = None  # where replicas run (default: the file's, else local)
    ray_address: str | None = Field(None, min_length=1)  # implies the ray backend; default: as ray.init finds one
    shadow: str | None = Field(None, min_length=1)  # a candidate recipe on shadow traffic, judged by the gate
    shadow_fraction: float | None = Field(None, gt=0, le=1)  # share of requests mirrored to it (default: 0.2)
    tenants: str | None = Field(None, min_length=1)  # the tenants file (tandem.deployment.tenants); reloaded on SIGHUP
    usage_db: str | None = Field(None, min_length=1)  # the usage ledger: a SQLite file or postgresql://...
    node_memory_gb: float | None = Field(None, gt=0)  # this machine's budget for replicas, GiB (over nodes.memory)

    @field_validator("regions", mode="before")
    @classmethod
    def _split_regions(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
            if not value:
                raise ValueError("expected comma-separated region names")
        return value

    @field_validator("replica_ports", mode="before")
    @classmethod
    def _port_range(cls, value: Any) -> Any:
        return parse_port_range(value)

    @property
    def gateway_mode(self) -> bool:
        return any(getattr(self, name) is not None for name in GATEWAY_MODE_FIELDS)

    def non_default(self, name: str) -> Any | None:
        """The value of `name` if it differs from the default, else None."""
        value = getattr(self, name)
        return None if value == type(self).model_fields[name].default else value


# --- loading: defaults <- file <- environment <- flags ------------------------------------------------
# What one load_settings call reads, for the sources below (pydantic-settings builds them per call).
_FILE_VALUES: ContextVar[Mapping[str, Any] | None] = ContextVar("tandem_settings_file", default=None)
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("tandem_settings_environ", default=None)


class _FileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # unused: __call__ suffices
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_VALUES.get() or {})


class _EnvironSource(EnvSettingsSource):
    """pydantic-settings' own TANDEM_* reader, over the mapping load_settings was given."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get()
        return parse_env_vars(os.environ if environ is None else environ, self.case_sensitive, self.env_ignore_empty)


class _Layered(BaseSettings, Settings):
    """Settings read through pydantic-settings: flags (init) over TANDEM_* variables over the file."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True, env_ignore_empty=True)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return init_settings, _EnvironSource(settings_cls), _FileSource(settings_cls)


def settings_variables() -> frozenset[str]:
    """The names of the TANDEM_* variables that are settings (TANDEM_CACHE and TANDEM_KERNELS are not)."""
    return frozenset({ENV_PREFIX + name.upper() for name in Settings.model_fields} | {ENV_PREFIX + "CONFIG"})


def settings_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The TANDEM_* variables that are settings, with their values."""
    names = settings_variables()
    return {k: v for k, v in environ.items() if k.upper() in names}


def _refuse_unknown(names: Mapping[str, Any], source: str, spell: Any) -> None:
    known = list(Settings.model_fields)
    for name in names:
        if name not in Settings.model_fields:
            hint = suggest(name, known)
            raise ConfigError(f"{source}{spell(name)}: unknown setting{hint or ' (known: ' + ', '.join(known) + ')'}")


def _refuse_env_typos(environ: Mapping[str, str]) -> None:
    """A TANDEM_* variable that is no setting but very close to one is a typo (TANDEM_MAX_NUM_SEQ).

    Others are left alone: TANDEM_CACHE, TANDEM_KERNELS and the like belong to other parts of tandem.
    """
    known = [name.upper() for name in Settings.model_fields] + ["CONFIG"]
    for name in environ:
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and upper.removeprefix(ENV_PREFIX) not in known:
            close = suggest(upper.removeprefix(ENV_PREFIX), known, cutoff=0.85)
            if close:
                raise ConfigError(
                    f"environment variable {name}: unknown setting{close.replace('mean ', 'mean ' + ENV_PREFIX)}"
                )


def load_settings(
    file: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Defaults <- file <- TANDEM_* variables <- flags (a flag whose value is None was not given).

    The file is `file`, else TANDEM_CONFIG. The variables come from `environ` (default: os.environ).
    """
    environ = os.environ if environ is None else environ
    _refuse_env_typos(environ)
    file = file if file is not None else environ.get(ENV_PREFIX + "CONFIG") or None
    values: dict[str, Any] = {}
    if file is not None:
        # Accept the flags' spelling too (max-num-seqs), so a file can be written from --help.
        values = {str(k).replace("-", "_"): v for k, v in load_mapping(file, "config file").items()}
        _refuse_unknown(values, f"{file}: ", lambda name: name)
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    _refuse_unknown(given, "", lambda name: "--" + name.replace("_", "-"))
    tokens = _FILE_VALUES.set(values), _ENVIRON.set(environ)
    try:
        layered = _Layered(**given)
    except ValidationError as exc:
        raise ConfigError("; ".join(_blame(exc, given, environ, file))) from None
    finally:
        _FILE_VALUES.reset(tokens[0])
        _ENVIRON.reset(tokens[1])
    return Settings.model_validate(layered.model_dump())


def _blame(exc: ValidationError, given: Mapping[str, Any], environ: Mapping[str, str], file: Any) -> list[str]:
    """Each problem, named by the source its value came from: --flag, TANDEM_VARIABLE or FILE: field."""
    lines = []
    for err, line in zip(exc.errors(), describe_errors(exc, Settings), strict=True):
        name = str(err["loc"][0]) if err["loc"] else ""
        env_name = ENV_PREFIX + name.upper()
        if name in given:
            lines.append(line.replace(name, "--" + name.replace("_", "-"), 1))
        elif env_name in {k.upper() for k in environ}:
            lines.append(line.replace(name, f"environment variable {env_name}", 1))
        elif file is not None:
            lines.append(f"{file}: {line}")
        else:
            lines.append(line)
    return lines
