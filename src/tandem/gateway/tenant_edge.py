"""The tenants at the gateway's edge, as two ASGI middlewares around the routes.

- `TenantAuthMiddleware` (before the body is read): the bearer key -> its tenant (the key's
  sha256 looked up; keys are never kept, logged or shown), 401 for a missing or unknown key, 403
  for /admin unless the tenant is `admin`. The tenant's name rides on the request as the
  `x-tandem-tenant` header (a client's own is dropped first), where the proxy's observers and the
  admission read it; it is never forwarded to a replica.
- `TenantLimitsMiddleware` (after the body is parsed), on completions: the model allow-list (404
  `model_not_found` naming the model), the tenant's queue cap, rate limits and budgets (429
  `rate_limit_exceeded` naming the limit, with `Retry-After`), and OpenAI's `x-ratelimit-*`
  headers on every answer. The request counts in flight (max_concurrency) until its last byte.
"""

from __future__ import annotations

import math

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandem.deployment.tenants import Tenant
from tandem.edge.auth import bearer_token
from tandem.edge.bodies import parsed_body
from tandem.edge.errors import APIError, error_response
from tandem.gateway.tenancy import TENANT_HEADER, Tenancy
from tandem.gateway.usage import estimate_prompt_tokens

__all__ = ["PROTECTED", "TenantAuthMiddleware", "TenantLimitsMiddleware", "scope_tenant"]

PROTECTED = ("/v1", "/admin", "/tokenize", "/detokenize")
LIMITED = ("/v1/completions", "/v1/chat/completions")
_TENANT = TENANT_HEADER.encode()
_BEARER = {"WWW-Authenticate": "Bearer"}


def scope_tenant(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == _TENANT:
            return value.decode("latin-1")
    return None


class TenantAuthMiddleware:
    def __init__(self, app: ASGIApp, tenancy: Tenancy) -> None:
        self.app, self.tenancy = app, tenancy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k != _TENANT]
        scope = {**scope, "headers": headers}
        if not scope["path"].startswith(PROTECTED):
            await self.app(scope, receive, send)
            return
        tenant, error = self._tenant(headers, scope["path"])
        if error is not None:
            await error_response(error)(scope, receive, send)
            return
        assert tenant is not None
        scope["headers"] = [*headers, (_TENANT, tenant.name.encode())]
        await self.app(scope, receive, send)

    def _tenant(self, headers: list[tuple[bytes, bytes]], path: str) -> tuple[Tenant | None, APIError | None]:
        tenants = self.tenancy.tenants
        open_door = self.tenancy.path is None and not tenants.tenants[0].key_hashes  # no --api-key, no file
        raw = next((v for k, v in headers if k == b"authorization"), None)
        token = bearer_token(raw.decode("latin-1") if raw is not None else None)
        if open_door:
            return tenants.tenants[0], None
        if token is None:
            return None, APIError(
                401, "missing API key: send the header 'Authorization: Bearer YOUR_KEY'", code="invalid_api_key",
                headers=_BEARER,
            )  # fmt: skip
        tenant = tenants.by_key(token)
        if tenant is None:
            return None, APIError(401, "incorrect API key provided", code="invalid_api_key", headers=_BEARER)
        if path.startswith("/admin") and not tenant.admin:
            return None, APIError(
                403, f"tenant {tenant.name!r} may not use the admin API (give it `admin: true` in the tenants file)",
                code="permission_denied",
            )  # fmt: skip
        return tenant, None


class TenantLimitsMiddleware:
    def __init__(self, app: ASGIApp, tenancy: Tenancy) -> None:
        self.app, self.tenancy = app, tenancy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in LIMITED:
            await self.app(scope, receive, send)
            return
        tenant = self.tenancy.tenant(scope_tenant(scope))
        if tenant is None:
            await self.app(scope, receive, send)
            return
        payload = parsed_body(scope)
        error = self._refusal(tenant, payload)
        if error is not None:
            if self.tenancy.usage is not None:  # counted per tenant: a 429 is part of its bill's story
                self.tenancy.usage.refused(tenant, payload, error.status)
            await error_response(error)(scope, receive, send)
            return
        limiter = self.tenancy.limiter

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(k.encode(), v.encode()) for k, v in limiter.headers(tenant).items()]
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            limiter.finish(tenant)

    def _refusal(self, tenant: Tenant, payload: object) -> APIError | None:
        model = payload.get("model") if isinstance(payload, dict) else None
        if tenant.models is not None and model not in tenant.models:
            shown = repr(model[:200]) if isinstance(model, str) else "(none given)"
            return APIError(
                404,
                f"the model {shown} does not exist or tenant {tenant.name!r} has no access to it "
                f"(its models: {', '.join(tenant.models)})",
                param="model", code="model_not_found",
            )  # fmt: skip
        admission = self.tenancy.admission
        if admission is not None and admission.queue.queued(tenant.name) >= tenant.limits.max_queued:
            return self._limited(tenant, "max_queued", 1.0, f"tenant {tenant.name!r} has {tenant.limits.max_queued} "
                                 "requests waiting for a replica, its max_queued")  # fmt: skip
        verdict = self.tenancy.limiter.admit(tenant, estimate_prompt_tokens(payload))
        if verdict.allowed:
            return None
        assert verdict.limit is not None
        return self._limited(tenant, verdict.limit, verdict.retry_after_s, verdict.message)

    def _limited(self, tenant: Tenant, limit: str, retry_after_s: float, message: str) -> APIError:
        headers = {"Retry-After": str(max(1, math.ceil(retry_after_s))), **self.tenancy.limiter.headers(tenant)}
        return APIError(
            429, f"{message} (limit: {limit}); retry after {max(1, math.ceil(retry_after_s))} s",
            code="rate_limit_exceeded", headers=headers,
        )  # fmt: skip
