"""Secrets out of the logs: every record made after `redact_secrets_in_logs` carries the secret only
as [redacted], in its message, its args, its traceback and its stack, whichever logger made it."""

from __future__ import annotations

import logging

import pytest

from tandem.edge.redact import REDACTED, SecretRedactor, redact_secrets_in_logs

SECRET = "s3cr3t-fleet-token-0123456789abcdef"


@pytest.fixture
def redacted():
    undo = redact_secrets_in_logs(SECRET)
    yield
    undo()


def test_no_record_of_any_logger_carries_the_secret(redacted, caplog):
    caplog.set_level(logging.DEBUG)
    argv = ["python", "-m", "tandem.cluster.tether", "--", "vllm", "serve", "--api-key", SECRET]
    logging.getLogger("tandem.cluster").info("started replica %s (pid %s): %s", "ext-1", 42, " ".join(argv))
    logging.getLogger("some.library").warning(f"header Authorization: Bearer {SECRET}")  # noqa: G004
    logging.getLogger("tandem.gateway").debug("args %r", {"key": SECRET})
    try:
        raise RuntimeError(f"the replica said {SECRET}")
    except RuntimeError:
        logging.getLogger("tandem.schedule").exception("tick failed")
    logging.getLogger("tandem").error("with a stack", stack_info=True, extra={"x": 1})
    text = caplog.text
    assert SECRET not in text
    assert f"--api-key {REDACTED}" in text and f"Bearer {REDACTED}" in text
    assert f"the replica said {REDACTED}" in text and "Traceback" in text
    assert all(SECRET not in logging.Formatter().format(r) for r in caplog.records)


def test_a_record_without_the_secret_keeps_its_template_and_args(redacted, caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger("tandem.gateway").info("replica %s ready after %.1f s", "fast-1", 2.5)
    (record,) = caplog.records
    assert record.msg == "replica %s ready after %.1f s" and record.args == ("fast-1", 2.5)  # rate limits group by it


def test_undo_puts_the_previous_factory_back():
    before = logging.getLogRecordFactory()
    undo = redact_secrets_in_logs(SECRET)
    assert logging.getLogRecordFactory() is not before
    undo()
    assert logging.getLogRecordFactory() is before


def test_short_or_empty_secrets_are_not_redacted():
    redactor = SecretRedactor(["", "abc", SECRET, SECRET + "-longer"])
    assert redactor.redact("abc") == "abc"
    assert redactor.redact(f"x {SECRET}-longer y {SECRET}") == f"x {REDACTED} y {REDACTED}"
