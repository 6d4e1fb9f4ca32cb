"""API-key check (an ASGI middleware, so a bad key is refused before the body is read).

It guards the paths under `protected` (the server: /v1; the gateway: /v1 and /admin). Health,
readiness, load and metrics stay open: load balancers, gateways and Prometheus probe them without keys.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from tandem.edge.errors import APIError, error_response

__all__ = ["ApiKeyMiddleware", "bearer_token"]

PROTECTED_PREFIXES: tuple[str, ...] = ("/v1",)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, protected: tuple[str, ...] = PROTECTED_PREFIXES) -> None:
        self.app = app
        self._key = api_key.encode()
        self._protected = protected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self._protected):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        raw = headers.get(b"authorization")
        token = bearer_token(raw.decode("latin-1") if raw is not None else None)
        if token is None:
            error = APIError(
                401,
                "missing API key: send the header 'Authorization: Bearer YOUR_KEY'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        elif not hmac.compare_digest(token.encode("latin-1", "replace"), self._key):
            error = APIError(
                401, "incorrect API key provided", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )
        else:
            await self.app(scope, receive, send)
            return
        await error_response(error)(scope, receive, send)
