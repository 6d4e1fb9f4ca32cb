"""The tenants file (`--tenants FILE`): who may call the gateway, with which keys, priority, limits,
budget and models. YAML checked by pydantic here at the file edge; frozen dataclasses inside.

    tenants:
      - name: search-team
        keys: [sha256:9f86d0...]            # hashes of API keys (`tandem keys new`), or env:VAR
        priority: interactive               # interactive | batch | an integer (higher first)
        weight: 1                           # share of the fleet against tenants of its priority
        limits: {rpm: 600, tpm: 200000, max_concurrency: 32, max_queued: 256}
        budget: {tokens_per_day: 5000000}   # and/or dollars_per_day
        models: [tandem-code-target]        # optional allow-list of the request's `model`
        admin: false                        # may call /admin
    fairness: {max_inflight_per_replica: 8, reserved_per_replica: 1, prompt_weight: 1, output_weight: 2}

A key is never stored: `sha256:HEX` is the hash of the key a client sends as its bearer token;
`env:VAR` names an environment variable holding the key itself (hashed at load, never kept). A
key maps to one tenant (a hash listed twice is an error). `--api-key KEY` alone is one anonymous
tenant holding that key, with no limits, allowed /admin.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "ANONYMOUS",
    "PRIORITIES",
    "Budget",
    "Fairness",
    "Limits",
    "Tenant",
    "Tenants",
    "TenantsError",
    "anonymous_tenants",
    "hash_key",
    "hash_prefix",
    "load_tenants",
    "new_key",
    "parse_tenants",
]

ANONYMOUS = "anonymous"
PRIORITIES = {"interactive": 1, "batch": 0}  # named classes; an integer is accepted too (higher first)
KEY_PREFIX = "tdm-"


class TenantsError(ValueError):
    """The tenants file is missing or wrong: the message names the file and the problem."""


def hash_key(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def hash_prefix(key_hash: str) -> str:
    """What /admin and logs may show of a key: its hash's first 12 hex digits."""
    return key_hash[: len("sha256:") + 12]


def new_key() -> tuple[str, str]:
    """A new random API key and its hash (what goes into the tenants file)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key)


@dataclass(frozen=True)
class Limits:
    rpm: float | None = None  # requests per minute (a token bucket holding a minute's worth)
    tpm: float | None = None  # tokens per minute: prompt at admission, output as it streams
    max_concurrency: int | None = None  # requests in flight at once (queued at the gateway included)
    max_queued: int = 256  # requests waiting at the gateway for a replica at once


@dataclass(frozen=True)
class Budget:
    tokens_per_day: int | None = None  # prompt + completion tokens per UTC day
    dollars_per_day: float | None = None  # replica-seconds attributed x the variant's price, per UTC day


@dataclass(frozen=True)
class Tenant:
    name: str
    key_hashes: tuple[str, ...] = ()
    priority: int = PRIORITIES["interactive"]
    weight: float = 1.0
    limits: Limits = Limits()
    budget: Budget = Budget()
    models: tuple[str, ...] | None = None  # None: any model
    admin: bool = False


@dataclass(frozen=True)
class Fairness:
    """How the gateway queues when the fleet is saturated (tandem.gateway.fair_queue)."""

    max_inflight_per_replica: int | None = None  # None: the primary's Profile.max_slots, else no gateway queue
    prompt_weight: float = 1.0  # VTC's w_p: service counted per prompt token
    output_weight: float = 2.0  # VTC's w_q: per output token
    reserved_per_replica: int = 1  # slots of a replica only the top priority class may take (replicas never preempt)


@dataclass(frozen=True)
class Tenants:
    tenants: tuple[Tenant, ...]
    fairness: Fairness = Fairness()
    source: str = "--api-key"
    _by_hash: Mapping[str, Tenant] = field(default_factory=dict, repr=False, compare=False)

    def by_key(self, key: str) -> Tenant | None:
        return self._by_hash.get(hash_key(key))

    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tenants)

    def get(self, name: str) -> Tenant | None:
        return next((t for t in self.tenants if t.name == name), None)


# --- the file edge ----------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _LimitsFile(_Strict):
    rpm: float | None = Field(None, gt=0)
    tpm: float | None = Field(None, gt=0)
    max_concurrency: int | None = Field(None, ge=1)
    max_queued: int = Field(256, ge=0)


class _BudgetFile(_Strict):
    tokens_per_day: int | None = Field(None, ge=0)
    dollars_per_day: float | None = Field(None, ge=0)


KeyRef = Annotated[str, Field(pattern=r"^(sha256:[0-9a-f]{64}|env:[A-Za-z_][A-Za-z0-9_]*)$")]


class _TenantFile(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    keys: list[KeyRef] = Field(min_length=1)
    priority: Literal["interactive", "batch"] | int = "interactive"
    weight: float = Field(1.0, gt=0)
    limits: _LimitsFile = _LimitsFile()
    budget: _BudgetFile = _BudgetFile()
    models: list[str] | None = Field(None, min_length=1)
    admin: bool = False


class _FairnessFile(_Strict):
    max_inflight_per_replica: int | None = Field(None, ge=1)
    prompt_weight: float = Field(1.0, ge=0)
    output_weight: float = Field(2.0, ge=0)
    reserved_per_replica: int = Field(1, ge=0)


class _TenantsFile(_Strict):
    tenants: list[_TenantFile] = Field(min_length=1)
    fairness: _FairnessFile = _FairnessFile()


def _problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the file"
    message = first["msg"]
    if first["type"] == "string_pattern_mismatch" and "keys" in first["loc"]:
        message = "a key must be 'sha256:' and 64 hex digits (`tandem keys new` prints one), or 'env:VARIABLE'"
    return f"{where}: {message}" + (f" ({len(exc.errors()) - 1} more problems)" if len(exc.errors()) > 1 else "")


def parse_tenants(raw: object, source: str = "the tenants file", env: Mapping[str, str] | None = None) -> Tenants:
    """Check `raw` (the YAML's data) and build Tenants; TenantsError naming the problem otherwise."""
    env = os.environ if env is None else env
    try:
        checked = _TenantsFile.model_validate(raw)
    except ValidationError as exc:
        raise TenantsError(f"{source}: {_problem(exc)}") from None
    by_hash: dict[str, Tenant] = {}
    tenants: list[Tenant] = []
    for t in checked.tenants:
        if any(t.name == seen.name for seen in tenants):
            raise TenantsError(f"{source}: tenant {t.name!r} is listed twice")
        hashes = []
        for ref in t.keys:
            if ref.startswith("env:"):
                value = env.get(ref[4:])
                if not value:
                    raise TenantsError(f"{source}: tenant {t.name!r}: the environment variable {ref[4:]} is not set")
                ref = hash_key(value)
            hashes.append(ref)
        tenant = Tenant(
            name=t.name,
            key_hashes=tuple(hashes),
            priority=PRIORITIES[t.priority] if isinstance(t.priority, str) else t.priority,
            weight=t.weight,
            limits=Limits(**t.limits.model_dump()),
            budget=Budget(**t.budget.model_dump()),
            models=tuple(t.models) if t.models is not None else None,
            admin=t.admin,
        )
        for h in hashes:
            other = by_hash.get(h)
            if other is not None:
                raise TenantsError(
                    f"{source}: the key {hash_prefix(h)}... is given to both {other.name!r} and {t.name!r}; "
                    "a key maps to one tenant"
                )
            by_hash[h] = tenant
        tenants.append(tenant)
    return Tenants(tuple(tenants), Fairness(**checked.fairness.model_dump()), source, by_hash)


def load_tenants(path: str | Path, env: Mapping[str, str] | None = None) -> Tenants:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise TenantsError(f"cannot read the tenants file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise TenantsError(f"{path} is not valid YAML: {exc}") from None
    return parse_tenants(raw, str(path), env)


def anonymous_tenants(api_key: str | None) -> Tenants:
    """`--api-key` alone (or no key at all): one anonymous tenant, no limits, allowed /admin."""
    hashes = (hash_key(api_key),) if api_key else ()
    tenant = Tenant(ANONYMOUS, hashes, admin=True)
    return Tenants((tenant,), Fairness(), "--api-key", {h: tenant for h in hashes})
