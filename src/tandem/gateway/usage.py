"""Usage as a gateway observer (tandem.gateway.observers): what each tenant's requests used, told to
the ledger, the tenant's limits (TPM counts output as it streams), the fair queue's counters and
the per-tenant metrics. Nothing in the proxy knows of it.

Tokens: a non-streamed answer's `usage`; a stream's own final `usage` chunk when the client asked
for one (`stream_options.include_usage`), else one token per content event (what the gateway can
count without a tokenizer). Until the answer's usage is known, the prompt counts as its text's
length / 4 (the same estimate the limits took at admission), corrected at the end.

Replica time: each replica's seconds, between two settlements (every second), are split across the
requests that ended on it meanwhile in proportion to their tokens; a replica that served nothing
meanwhile is billed to the tenant `(idle)`. Dollars = those replica-seconds x the variant's price
per replica-hour (its `usd_per_hour`, else tandem's pinned price).

Metrics (bounded labels: tenants from the file; a model name only once a replica answered 2xx for
it, else `other`): `tandem:tenant_tokens_total{tenant,model,kind}` (kind: prompt, completion) and
`tandem:tenant_requests_total{tenant,model,code}`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from tandem.deployment.tenants import Tenant
from tandem.gateway.ledger import UsageRecord
from tandem.gateway.observers import NO_REQUEST_OBSERVER, RequestObserver
from tandem.gateway.tenancy import PRIORITY_HEADER, TENANT_HEADER, Tenancy
from tandem.pricing import DEFAULT_PRICE
from tandem.schedule.variant import Variant

__all__ = ["IDLE", "ReplicaTime", "TenantMetrics", "UsageObserver", "estimate_prompt_tokens"]

IDLE = "(idle)"
OTHER_MODEL = "other"
CLIENT_CLOSED = 499
_OBSERVED = ("/v1/completions", "/v1/chat/completions")


def estimate_prompt_tokens(payload: Any) -> int:
    """A prompt's tokens before any tokenizer saw it: its text's length / 4 (at least 1)."""
    if not isinstance(payload, dict):
        return 1
    prompt = payload.get("prompt")
    if isinstance(prompt, list):
        text = " ".join(
            p if isinstance(p, str) else " " * 4 * len(p) if isinstance(p, list) else "    " for p in prompt
        )
    elif isinstance(prompt, str):
        text = prompt
    else:
        messages = payload.get("messages")
        text = (
            "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            if isinstance(messages, list)
            else ""
        )
    return max(1, len(text) // 4)


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.tokens = Counter(
            "tandem:tenant_tokens", "Tokens per tenant and model (kind: prompt, completion).",
            ("tenant", "model", "kind"), registry=registry,
        )  # fmt: skip
        self.requests = Counter(
            "tandem:tenant_requests", "Requests per tenant and model, by the HTTP status the client got.",
            ("tenant", "model", "code"), registry=registry,
        )  # fmt: skip


@dataclass
class _Served:
    tenant: str
    model: str
    variant: str
    tokens: int


class ReplicaTime:
    """Each replica's seconds, split across the requests it served by their tokens (see the module doc)."""

    def __init__(self) -> None:
        self.served: dict[str, list[_Served]] = defaultdict(list)  # replica url -> requests ended since
        self.since: dict[str, float] = {}  # replica url -> when its time was last settled

    def add(self, url: str, tenant: str, model: str, variant: str, tokens: int) -> None:
        self.served[url].append(_Served(tenant, model, variant, max(tokens, 1)))

    def settle(self, now: float, replicas: Mapping[str, Variant]) -> list[UsageRecord]:
        """Records of replica time (status 0) for every replica up now (url -> its variant)."""
        out: list[UsageRecord] = []
        for url, variant in replicas.items():
            start = self.since.get(url, now)
            self.since[url] = now
            seconds = max(0.0, now - start)
            served = self.served.pop(url, [])
            price = variant.usd_per_hour if variant.usd_per_hour is not None else DEFAULT_PRICE[0]
            if not served:
                if seconds > 0:
                    out.append(UsageRecord(now, IDLE, "", variant.name, 0, replica_seconds=seconds,
                                           dollars=seconds * price / 3600))  # fmt: skip
                continue
            total = sum(s.tokens for s in served)
            shares: dict[tuple[str, str, str], float] = defaultdict(float)
            for s in served:
                shares[(s.tenant, s.model, s.variant)] += seconds * s.tokens / total
            for (tenant, model, name), share in shares.items():
                out.append(
                    UsageRecord(now, tenant, model, name, 0, replica_seconds=share, dollars=share * price / 3600)
                )
        for url in set(self.since) - set(replicas):  # gone: what it served last is settled at 0 s
            del self.since[url]
            self.served.pop(url, None)
        return out


class _Request:
    def __init__(self, owner: UsageObserver, tenant: Tenant, model: str, stream: bool, prompt_estimate: int) -> None:
        self.owner, self.tenant, self.model = owner, tenant, model
        self.stream, self.prompt_estimate = stream, prompt_estimate
        self.status, self.url = 0, ""
        self.variant: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.events = 0  # content events of a stream (one token each, unless its usage says)
        self.charged = 0  # output tokens already charged to the limits and the queue
        self.finished = False
        self.body = b""
        self.tail = b""

    def attempt(self, url: str, stream: bool, at: float) -> None:
        self.url, self.stream = url, stream
        self.variant = self.owner.variant_of(url)

    def headers(self) -> Mapping[str, str]:
        return {PRIORITY_HEADER: str(-self.tenant.priority)}  # vLLM's priority: lower is served first

    def response(self, status: int, headers: Mapping[str, str], at: float) -> None:
        self.status = status

    def chunk(self, data: bytes, at: float) -> None:
        if not self.stream:
            self.body += data
            return
        text = self.tail + data
        events = text.split(b"\n\n")
        self.tail = events.pop()
        new = 0
        for event in events:
            line = event.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            try:
                parsed = json.loads(line[5:])
            except ValueError:
                continue
            usage = parsed.get("usage") if isinstance(parsed, dict) else None
            if isinstance(usage, dict):
                self._usage(usage)
            if isinstance(parsed, dict) and parsed.get("choices"):
                new += 1
        self.events += new
        if new:
            self.charged += new
            self.owner.charge_output(self.tenant, new)

    def _usage(self, usage: Mapping[str, Any]) -> None:
        try:
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
        except (TypeError, ValueError):
            pass

    def done(self, variant: str | None, at: float, error: str | None = None) -> None:
        if self.finished:
            return
        if not self.stream and self.body:
            try:
                usage = json.loads(self.body).get("usage")
                if isinstance(usage, dict):
                    self._usage(usage)
            except (ValueError, AttributeError):
                pass
        self._end(variant, self.status or 503)

    def cancelled(self) -> None:
        if not self.finished:
            self._end(self.variant, CLIENT_CLOSED)

    def _end(self, variant: str | None, status: int) -> None:
        self.finished = True
        served = variant is not None and 200 <= self.status < 300  # a replica answered (maybe cut short)
        prompt = self.prompt_tokens if self.prompt_tokens is not None else (self.prompt_estimate if served else 0)
        completion = self.completion_tokens if self.completion_tokens is not None else self.events
        self.owner.ended(self, variant, status, prompt, completion)


class UsageObserver:
    """The gateway's usage observer (an Observer); `variants`: every variant known by name (the fleet's)."""

    def __init__(
        self, tenancy: Tenancy, metrics: TenantMetrics, variants: Callable[[], Mapping[str, Variant]],
        urls: Callable[[], Mapping[str, str]], wall: Callable[[], float],
    ) -> None:  # fmt: skip
        """`urls()`: each replica's url -> its variant's name (the backend's list)."""
        self.tenancy, self.metrics, self.variants, self.urls, self.wall = tenancy, metrics, variants, urls, wall
        self.replica_time = ReplicaTime()
        self.known_models: set[str] = set()

    def request(self, path: str, payload: Any, headers: Mapping[str, str]) -> RequestObserver:
        tenant = self.tenancy.tenant(headers.get(TENANT_HEADER))
        if tenant is None or path not in _OBSERVED:
            return NO_REQUEST_OBSERVER
        model = payload.get("model") if isinstance(payload, dict) else None
        stream = bool(payload.get("stream")) if isinstance(payload, dict) else False
        return _Request(self, tenant, model if isinstance(model, str) else "", stream, estimate_prompt_tokens(payload))

    def refused(self, tenant: Tenant, payload: Any, status: int) -> None:
        """A request the gateway refused for the tenant's limits or models (never sent to a replica)."""
        model = payload.get("model") if isinstance(payload, dict) else None
        label = model if isinstance(model, str) and model in self.known_models else OTHER_MODEL
        self.metrics.requests.labels(tenant.name, label, str(status)).inc()
        self.tenancy.ledger.record(UsageRecord(self.wall(), tenant.name, label, "none", status, 1))

    def variant_of(self, url: str) -> str | None:
        return self.urls().get(url)

    def charge_output(self, tenant: Tenant, tokens: int) -> None:
        self.tenancy.limiter.charge(tenant, tokens=tokens)
        if self.tenancy.admission is not None:
            self.tenancy.admission.queue.charge(tenant.name, output_tokens=tokens, weight=tenant.weight)

    def ended(self, request: _Request, variant: str | None, status: int, prompt: int, completion: int) -> None:
        tenant = request.tenant
        # The limits took the estimate at admission and the streamed events since: correct them.
        correction = (prompt - request.prompt_estimate) + (completion - request.charged)
        if correction:
            self.tenancy.limiter.charge(tenant, tokens=correction)
            if self.tenancy.admission is not None and completion > request.charged:
                self.tenancy.admission.queue.charge(
                    tenant.name, output_tokens=completion - request.charged, weight=tenant.weight
                )
        model = request.model[:200]
        if 200 <= status < 300 and model:
            self.known_models.add(model)
        label = model if model in self.known_models else OTHER_MODEL
        self.metrics.requests.labels(tenant.name, label, str(status)).inc()
        if prompt:
            self.metrics.tokens.labels(tenant.name, label, "prompt").inc(prompt)
        if completion:
            self.metrics.tokens.labels(tenant.name, label, "completion").inc(completion)
        name = variant or "none"
        self.tenancy.ledger.record(UsageRecord(self.wall(), tenant.name, label, name, status, 1, prompt, completion))
        if variant is not None and request.url:
            self.replica_time.add(request.url, tenant.name, label, name, prompt + completion)

    def settle(self) -> None:
        """Attribute the replicas' time since the last settlement; charge its dollars to the budgets."""
        known = self.variants()
        up = {url: known[v] for url, v in self.urls().items() if v in known}
        for record in self.replica_time.settle(self.wall(), up):
            self.tenancy.ledger.record(record)
            tenant = self.tenancy.tenant(record.tenant)
            if tenant is not None and record.dollars:
                self.tenancy.limiter.charge(tenant, dollars=record.dollars)
