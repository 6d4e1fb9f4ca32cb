"""What the engine refuses at admission, in one place (no torch): every refusal is a RequestError
whose message says why, so callers catch one kind whatever piece found the problem."""

from __future__ import annotations

__all__ = ["PromptTooLongError", "RequestError"]


class RequestError(ValueError):
    """A request the engine refuses at admission; the message says why."""


class PromptTooLongError(RequestError):
    pass
