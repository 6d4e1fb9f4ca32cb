"""Secrets out of the logs: every log record of the process has a secret's value replaced.

The gateway's fleet secret reaches text it logs in ways no one line can foresee: an external engine
whose `command` template says `{api_key}` puts it in the "started replica" line (the argv), a
replica that prints its own command line puts it in the output tail the gateway logs when that
replica dies, an exception may carry it. So rather than a filter on some loggers or handlers (a
handler added later, or a record of a logger's child, would pass it by), `redact_secrets_in_logs`
wraps the process's LogRecord factory: each record is made with the secret already replaced in its
message, its traceback and its stack, whoever logs it and wherever it goes. A record without the
secret is left as it was (its template and args intact for the filters that group by them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["REDACTED", "SecretRedactor", "redact_secrets_in_logs"]

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter text is not redacted: it would blank out ordinary words, and is no secret

_lock = threading.Lock()


class SecretRedactor:
    """Replaces the values of `secrets` in text and in log records."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first, so a secret that holds another is replaced whole.
        self.secrets = sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def holds_secret(self, text: str | None) -> bool:
        return bool(text) and any(secret in text for secret in self.secrets)  # type: ignore[operator]

    def record(self, record: logging.LogRecord) -> logging.LogRecord:
        """`record`, its message, traceback and stack with the secrets replaced (the same object)."""
        try:
            message = record.getMessage()
        except Exception:  # a bad template: logging reports it when the record is handled
            return record
        if self.holds_secret(message):
            record.msg, record.args = self.redact(message), ()
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            if self.holds_secret(text):
                record.exc_text = self.redact(text)  # a formatter uses this rather than formatting again
        if self.holds_secret(record.exc_text):
            record.exc_text = self.redact(record.exc_text)  # type: ignore[arg-type]
        if self.holds_secret(record.stack_info):
            record.stack_info = self.redact(record.stack_info)  # type: ignore[arg-type]
        return record


def redact_secrets_in_logs(*secrets: str) -> Callable[[], None]:
    """Make every log record of this process from now on carry `secrets` only as REDACTED. Returns a
    function that undoes it (it puts the previous factory back while this one is still the current)."""
    redactor = SecretRedactor(secrets)
    with _lock:
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            return redactor.record(previous(*args, **kwargs))

        logging.setLogRecordFactory(factory)

    def undo() -> None:
        with _lock:
            if logging.getLogRecordFactory() is factory:
                logging.setLogRecordFactory(previous)

    return undo
