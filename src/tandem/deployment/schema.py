"""The deployment file's shape: pydantic models, used at this edge only (tandem.deployment.parse turns a
validated file into frozen dataclasses). `deployment_schema()` is its JSON Schema
(`tandem serve --print-deployment-schema`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

from tandem.deployment.engine import EngineFields
from tandem.deployment.sizes import parse_bytes
from tandem.gate.config import GateSettings

__all__ = ["DEFAULT_MAX_REPLICAS", "DeploymentFile", "deployment_schema"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_MAX_REPLICAS = 4


class _Replicas(_Strict):
    min: int = Field(1, ge=0)
    max: int = Field(DEFAULT_MAX_REPLICAS, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> _Replicas:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class _Resources(_Strict):
    memory: StrictInt | StrictStr | None = Field(
        None, description="Memory each replica reserves on its node: bytes, or 2GiB, 512MiB (default: from the "
        "Profile: weights + KV budget + runtime; none without a Profile).",
    )  # fmt: skip
    accelerators: float = Field(0.0, ge=0, description="Accelerators (GPUs) per replica.")
    accelerator_type: str | None = Field(None, min_length=1, description="Kind of accelerator, e.g. A100.")

    @field_validator("memory")
    @classmethod
    def _size(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            parse_bytes(value)
        return value


class _Variant(EngineFields):  # engine, command, ready_path, metrics, env: tandem.deployment.engine
    name: str = Field(
        min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="How routing and metrics call it."
    )
    recipe: str | None = Field(
        None, min_length=1, description="Optimizer recipe, as text the replica validates (omit: its default)."
    )
    profile: str | dict[str, Any] | None = Field(
        None, description="Measured Profile: a JSON file (relative to this file) or inline; capacity needs it."
    )
    model: str | None = Field(None, description="HF model directory (default: the file's model).")
    threads: int | None = Field(None, ge=1, description="torch threads per replica.")
    regions: list[str] | None = Field(None, min_length=1)
    replicas: _Replicas = _Replicas()
    args: list[str] = Field([], description="More `tandem serve` flags for each replica, verbatim.")
    resources: _Resources = Field(_Resources(), description="What each replica reserves on its node (Ray).")
    usd_per_hour: float | None = Field(
        None, gt=0, description="Price of one replica-hour, for the gate's unit cost (default: tandem's pinned price)."
    )


class _Policy(_Strict):
    name: Literal["hpa", "kpa", "capacity"] = "capacity"
    interval_s: float = Field(1.0, gt=0, description="Seconds between controller ticks.")
    params: dict[str, Any] = Field({}, description="The policy's parameters (HpaParams, KpaParams, CapacityParams).")
    limits: dict[str, Any] = Field({}, description="ScaleLimits: rates, steps and cooldowns.")


class _Router(_Strict):
    name: Literal["least-outstanding", "power-of-two", "region-aware", "prefix-affinity", "kv-aware"] = (
        "least-outstanding"
    )
    params: dict[str, Any] = {}


class _Backend(_Strict):
    name: Literal["local", "ray"] = Field("local", description="local: processes on this machine; ray: a Ray cluster.")
    address: str | None = Field(
        None, min_length=1, description="Ray: the cluster's address (HOST:6379, or auto). Default: RAY_ADDRESS, "
        "else the cluster `ray start` left on this machine, else a new local one.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _address_for_ray(self) -> _Backend:
        if self.address is not None and self.name != "ray":
            raise ValueError("an address is for the ray backend (name: ray)")
        if self.address is not None and self.address.startswith("ray://"):
            raise ValueError(
                "Ray Client addresses (ray://) are not supported: run the gateway on a machine of the cluster "
                "and give the cluster's address (HOST:6379)"
            )
        return self


class _Retries(_Strict):
    max_attempts: int = Field(3, ge=1)


class DeploymentFile(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, title="tandem deployment file")

    model: str | None = Field(None, description="Every variant's model directory (omit: the bundled model).")
    threads: int | None = Field(None, ge=1, description="torch threads per replica.")
    regions: list[str] = Field(["local"], min_length=1)
    primary: str | None = Field(None, description="The variant that serves by default (default: the first).")
    fallback: str | None = Field(None, description="The variant that re-runs requests failed before the first byte.")
    variants: list[_Variant] = Field(min_length=1)
    policy: _Policy = _Policy()
    router: _Router = _Router()
    breaker: dict[str, Any] = Field({}, description="BreakerConfig fields.")
    retries: _Retries = _Retries()
    controller: dict[str, Any] = Field({}, description="ControllerConfig fields (timeouts, restart backoff).")
    backend: _Backend = Field(_Backend(), description="Where replicas run.")
    gate: GateSettings | None = Field(None, description="Shadow traffic to a candidate variant, and its gate.")


def deployment_schema() -> dict[str, Any]:
    """The deployment file's JSON Schema (for editors and CI checks of deployment files)."""
    return DeploymentFile.model_json_schema()
