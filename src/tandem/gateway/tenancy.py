"""Tenancy: the gateway's tenants, their limits' state, the fair queue and the usage ledger, as one
piece the app, the proxy and the admin API share (`Gateway.tenancy`; None: one anonymous tenant
and the gateway as before).

- `tenants`: the current tenants file (tandem.deployment.tenants), swapped whole on `reload()`
  (SIGHUP, POST /admin/tenants/reload); a bad file keeps the old one and says what is wrong.
- `limiter`: each tenant's rate-limit and budget state (tandem.gateway.limits: pure decisions on
  frozen state; the wall clock passed in); today's tokens and dollars are read back from the ledger
  at start, so a restart does not reset a budget.
- `admission`: the fair queue (tandem.gateway.admission), when the fleet is capped per replica.
- `ledger`: where usage is written (tandem.gateway.ledger); the usage observer
  (tandem.gateway.usage) records into it and charges the limiter and the queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.contracts import PRIORITY_HEADER
from tandem.deployment.tenants import Tenant, Tenants, TenantsError, load_tenants
from tandem.gateway import limits
from tandem.gateway.admission import FairAdmission
from tandem.gateway.ledger import Ledger

__all__ = ["Limiter", "Tenancy", "TENANT_HEADER", "PRIORITY_HEADER"]

logger = logging.getLogger("tandem.gateway")

TENANT_HEADER = "x-tandem-tenant"  # set by the gateway's auth on the request's scope (a client's own is dropped)


class Limiter:
    """Each tenant's limits state; not thread-safe (the event loop's)."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.wall = wall
        self.states: dict[str, limits.TenantState] = {}

    def admit(self, tenant: Tenant, prompt_tokens: int) -> limits.Verdict:
        verdict, self.states[tenant.name] = limits.admit(
            self.states.get(tenant.name, limits.TenantState()), tenant, self.wall(), prompt_tokens
        )
        return verdict

    def charge(self, tenant: Tenant, tokens: int = 0, dollars: float = 0.0) -> None:
        state = self.states.get(tenant.name, limits.TenantState())
        self.states[tenant.name] = limits.charge(state, tenant, self.wall(), tokens, dollars)

    def finish(self, tenant: Tenant) -> None:
        if tenant.name in self.states:
            self.states[tenant.name] = limits.finish(self.states[tenant.name])

    def headers(self, tenant: Tenant) -> dict[str, str]:
        return limits.ratelimit_headers(self.states.get(tenant.name, limits.TenantState()), tenant, self.wall())

    def in_flight(self, name: str) -> int:
        state = self.states.get(name)
        return state.in_flight if state is not None else 0


@dataclass
class Tenancy:
    tenants: Tenants
    ledger: Ledger
    limiter: Limiter
    admission: FairAdmission | None = None
    path: Path | None = None  # the tenants file (None: --api-key's anonymous tenant)
    reloaded_at: float | None = None
    on_reload: list[Callable[[Tenants], None]] = field(default_factory=list)
    usage: Any = None  # the UsageObserver (tandem.gateway.usage) recording into `ledger`

    def tenant(self, name: str | None) -> Tenant | None:
        return self.tenants.get(name) if name else None

    def reload(self) -> Tenants:
        """Read the tenants file again; on any problem keep the current tenants and raise TenantsError."""
        if self.path is None:
            raise TenantsError("the gateway was started without --tenants: there is no tenants file to reload")
        tenants = load_tenants(self.path)  # raises: the old tenants stay
        self.tenants = tenants
        self.reloaded_at = self.limiter.wall()
        for hook in self.on_reload:
            hook(tenants)
        logger.info("tenants reloaded from %s: %s", self.path, ", ".join(tenants.names()))
        return tenants

    def restore_today(self) -> None:
        """Today's (UTC) tokens and dollars per tenant from the ledger, so a restart keeps the budgets."""
        now = self.limiter.wall()
        start = (now // limits.DAY_S) * limits.DAY_S
        for tenant, tokens, dollars in self.ledger.totals_since(start):
            if self.tenants.get(tenant) is not None:
                self.limiter.states[tenant] = limits.TenantState(
                    day=int(now // limits.DAY_S), tokens_today=tokens, dollars_today=dollars
                )
