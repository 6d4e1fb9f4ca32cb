"""A variant's engine in the deployment file: tandem's own (default) or an external OpenAI-compatible server.

```yaml
variants:
  - name: vllm-fp8
    engine: external
    model: meta-llama/Llama-3.1-8B-Instruct
    command: [vllm, serve, "{model}", --host, "{host}", --port, "{port}", --quantization, fp8,
              --served-model-name, "{served_model_name}"]
    env: {VLLM_API_KEY: "{api_key}"}    # the fleet's secret, only where a template asks for it
    ready_path: /health                 # GET answers 200 once it serves (default /health)
    metrics: {adapter: vllm, path: /metrics}   # vllm | sglang | llamacpp | none (gateway in-flight)
    profile: profiles/vllm-fp8.json     # `tandem profile --endpoint URL` measures one black-box
    resources: {accelerators: 1}
```

pydantic at this edge (`EngineFields`, the part of a variant's schema that says how it runs);
`external_engine()` turns it into tandem.cluster.external.ExternalEngine, with errors that name the
field. Placeholders and the fleet secret: see tandem.cluster.external.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.cluster.external import METRICS_ADAPTERS, PLACEHOLDERS, ExternalEngine
from tandem.data.bundled import bundled_model_dir
from tandem.edge.files import ConfigError

__all__ = ["EngineFields", "default_served_name", "external_engine"]

_EXTERNAL_ONLY = ("command", "ready_path", "metrics", "env")


class _Metrics(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    adapter: Literal[METRICS_ADAPTERS] = Field(  # type: ignore[valid-type]
        "none", description="How to read its Prometheus text into loads (none: the gateway's in-flight counts)."
    )
    path: str = Field("/metrics", pattern=r"^/", description="Where it serves Prometheus text.")


class EngineFields(BaseModel):
    """The fields of a variant that say what runs its replicas."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["tandem", "external"] = Field(
        "tandem", description="tandem: `tandem serve` with the recipe; external: any OpenAI-compatible server."
    )
    command: list[str] | None = Field(
        None, min_length=1, description="external: argv template; placeholders " + ", ".join(f"{{{p}}}" for p in
        PLACEHOLDERS) + ".",
    )  # fmt: skip
    ready_path: str | None = Field(None, pattern=r"^/", description="external: GET answers 200 when ready (/health).")
    metrics: _Metrics | None = Field(None, description="external: where its load comes from.")
    env: dict[str, str] = Field({}, description="external: more environment; values are templates too.")

    @model_validator(mode="after")
    def _engine_fields(self) -> EngineFields:
        if self.engine == "tandem":
            given = [name for name in _EXTERNAL_ONLY if getattr(self, name) not in (None, {})]
            if given:
                raise ValueError(f"{given[0]} is for external engines (engine: external)")
        elif self.command is None:
            raise ValueError("an external engine needs its command: a list, the program then its arguments")
        return self


def default_served_name(model: str | None) -> str:
    """What tandem replicas answer to by default: the model directory's name (the bundled model's)."""
    if model is None:
        return bundled_model_dir().name
    return Path(model).name if Path(model).exists() else model


def external_engine(
    fields: EngineFields,
    *,
    model: str | None,
    threads: int | None,
    recipe: str | None,
    args: list[str],
    served_model_name: str,
    where: str,
    error: type[ConfigError] = ConfigError,
) -> ExternalEngine | None:
    """The variant's external engine (None: a tandem variant); `error` names `where` and the field."""
    if fields.engine != "external":
        return None
    if recipe is not None:
        raise error(f"{where}.recipe: a recipe is for tandem replicas; an external engine's optimizations "
                    "are flags in its command")  # fmt: skip
    if args:
        raise error(f"{where}.args: `tandem serve` flags are for tandem replicas; put the engine's in its command")
    metrics = fields.metrics or _Metrics()
    try:
        engine = ExternalEngine(
            command=tuple(fields.command or ()),
            ready_path=fields.ready_path or "/health",
            env=tuple(sorted(fields.env.items())),
            metrics_adapter=metrics.adapter,
            metrics_path=metrics.path,
            served_model_name=served_model_name,
        )
    except ValueError as exc:
        raise error(f"{where}.command: {exc}") from None
    missing: dict[str, Any] = {"model": model, "threads": threads}
    for name, value in missing.items():
        if name in engine.fields and value is None:
            raise error(f"{where}.command: uses {{{name}}} but the variant has no {name} (set it on the variant)")
    return engine
