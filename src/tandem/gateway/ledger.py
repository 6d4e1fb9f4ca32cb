"""The usage ledger: what each tenant used, per model and variant, in a real database (SQLAlchemy Core).

SQLite by default (one file under the cache directory, WAL mode); PostgreSQL when the URL says
`postgresql://...` (several gateways may share one ledger: rows are added to, never overwritten).
One table, one row per (minute, tenant, model, variant, status), summed as records arrive:

    tandem_usage(minute BIGINT, tenant, model, variant, status INT,      -- the key
                 requests, prompt_tokens, completion_tokens BIGINT, replica_seconds, dollars FLOAT)

`status` is the HTTP status the client got (499: it left first); rows of status 0 carry the
replica time attributed to the tenant (tandem.gateway.usage) and count no request.

Writes go through a queue to one writer thread, which sums what arrived and commits it every
`flush_interval_s` (0.5 s): the event loop never waits on the database, and a gateway killed with
SIGKILL loses at most the records of the last flush interval plus the one being committed (about
one second). `flush()` waits until everything recorded so far is committed; `close()` flushes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

__all__ = ["GROUPS", "Ledger", "LedgerError", "UsageRecord", "default_usage_db", "ledger_url", "moment_from"]

logger = logging.getLogger("tandem.gateway")

GROUPS = {"minute": 60, "hour": 3600, "day": 86400}
_KEY = ("minute", "tenant", "model", "variant", "status")
_SUMS = ("requests", "prompt_tokens", "completion_tokens", "replica_seconds", "dollars")

metadata = sa.MetaData()
usage_table = sa.Table(
    "tandem_usage",
    metadata,
    sa.Column("minute", sa.BigInteger, primary_key=True),
    sa.Column("tenant", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(200), primary_key=True),
    sa.Column("variant", sa.String(200), primary_key=True),
    sa.Column("status", sa.Integer, primary_key=True),
    sa.Column("requests", sa.BigInteger, nullable=False, default=0),
    sa.Column("prompt_tokens", sa.BigInteger, nullable=False, default=0),
    sa.Column("completion_tokens", sa.BigInteger, nullable=False, default=0),
    sa.Column("replica_seconds", sa.Float, nullable=False, default=0.0),
    sa.Column("dollars", sa.Float, nullable=False, default=0.0),
)


class LedgerError(RuntimeError):
    """The usage database cannot be opened (the message says which and why)."""


@dataclass(frozen=True)
class UsageRecord:
    at: float  # wall-clock seconds (UTC)
    tenant: str
    model: str
    variant: str
    status: int
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    replica_seconds: float = 0.0
    dollars: float = 0.0


def default_usage_db() -> Path:
    from tandem.schedule.profiles import cache_dir

    return cache_dir() / "usage.db"


def ledger_url(where: str | Path) -> str:
    """A SQLAlchemy URL for `--usage-db`: a file path (SQLite) or a postgresql:// URL."""
    text = str(where)
    if text.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + text.split("://", 1)[1]
    if text.startswith(("postgresql+", "sqlite:")):
        return text
    if "://" in text:
        raise LedgerError(f"--usage-db {text.split('://')[0]}://...: give a file path (SQLite) or postgresql://...")
    return f"sqlite:///{Path(text).expanduser()}"


def _engine(url: str) -> sa.Engine:
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"cannot create the folder of the usage database {path}: {exc.strerror}") from None
        engine = sa.create_engine(url)

        @sa.event.listens_for(engine, "connect")
        def _pragmas(connection: Any, _record: Any) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.close()

        return engine
    try:
        return sa.create_engine(url, pool_pre_ping=True)
    except ModuleNotFoundError as exc:
        raise LedgerError(
            f"a PostgreSQL ledger needs the psycopg driver ({exc}): pip install 'psycopg[binary]'"
        ) from None


class Ledger:
    def __init__(self, where: str | Path, flush_interval_s: float = 0.5) -> None:
        self.url = ledger_url(where)
        self.engine = _engine(self.url)
        try:
            metadata.create_all(self.engine)
        except sa.exc.SQLAlchemyError as exc:
            raise LedgerError(f"cannot open the usage database {self.where}: {exc.__class__.__name__}: {exc}") from None
        self.flush_interval_s = flush_interval_s
        self._queue: queue.SimpleQueue[UsageRecord | threading.Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.write_errors = 0

    @property
    def where(self) -> str:
        """The database, without a password."""
        return self.engine.url.render_as_string(hide_password=True)

    # --- writing ---------------------------------------------------------------------------------
    def record(self, record: UsageRecord) -> None:
        """Queue one record (any thread; never blocks)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_loop, name="tandem-ledger", daemon=True)
            self._thread.start()
        self._queue.put(record)

    def flush(self, timeout_s: float = 10.0) -> None:
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout_s)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(10.0)
            self._thread = None
        self.engine.dispose()

    def _write_loop(self) -> None:
        pending: dict[tuple, list[float]] = {}
        waiters: list[threading.Event] = []
        next_flush = time.monotonic() + self.flush_interval_s
        stop = False
        while not stop:
            try:
                item = self._queue.get(timeout=max(0.0, next_flush - time.monotonic()))
            except queue.Empty:
                item = ...
            if item is None:
                stop = True
            elif isinstance(item, threading.Event):
                waiters.append(item)
            elif isinstance(item, UsageRecord):
                key = (int(item.at // 60) * 60, item.tenant, item.model, item.variant, item.status)
                sums = pending.setdefault(key, [0, 0, 0, 0.0, 0.0])
                for i, name in enumerate(_SUMS):
                    sums[i] += getattr(item, name)
                continue
            if stop or waiters or time.monotonic() >= next_flush:
                if pending:
                    try:
                        self._commit(pending)
                        pending = {}
                    except sa.exc.SQLAlchemyError as exc:  # kept and retried next time
                        self.write_errors += 1
                        logger.warning("could not write usage to %s (kept, retried): %s", self.where, exc)
                for waiter in waiters:
                    waiter.set()
                waiters = []
                next_flush = time.monotonic() + self.flush_interval_s

    def _commit(self, pending: dict[tuple, list[float]]) -> None:
        rows = [
            {**dict(zip(_KEY, key, strict=True)), **dict(zip(_SUMS, sums, strict=True))}
            for key, sums in pending.items()
        ]
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        statement = dialect.insert(usage_table)
        statement = statement.on_conflict_do_update(
            index_elements=list(_KEY),
            set_={name: usage_table.c[name] + statement.excluded[name] for name in _SUMS},
        )
        with self.engine.begin() as connection:
            connection.execute(statement, rows)

    # --- reading ---------------------------------------------------------------------------------
    def query(
        self, tenant: str | None = None, model: str | None = None, since: float | None = None,
        until: float | None = None, group_by: str = "day",
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Usage summed per (period, tenant, model, variant), oldest first; `requests` by status."""
        width = GROUPS[group_by]
        t = usage_table
        period = (t.c.minute // width) * width
        columns = [period.label("period"), t.c.tenant, t.c.model, t.c.variant, t.c.status]
        statement = sa.select(*columns, *(sa.func.sum(t.c[name]).label(name) for name in _SUMS))
        if tenant is not None:
            statement = statement.where(t.c.tenant == tenant)
        if model is not None:
            statement = statement.where(t.c.model == model)
        if since is not None:
            statement = statement.where(t.c.minute >= int(since // 60) * 60)
        if until is not None:
            statement = statement.where(t.c.minute < until)
        statement = statement.group_by(*columns).order_by(*columns)
        with self.engine.connect() as connection:
            found = connection.execute(statement).all()
        return _fold(found)

    def totals_since(self, start: float) -> Iterable[tuple[str, int, float]]:
        """(tenant, prompt + completion tokens, dollars) since `start`."""
        t = usage_table
        statement = (
            sa.select(t.c.tenant, sa.func.sum(t.c.prompt_tokens + t.c.completion_tokens), sa.func.sum(t.c.dollars))
            .where(t.c.minute >= int(start // 60) * 60)
            .group_by(t.c.tenant)
        )
        with self.engine.connect() as connection:
            return [
                (name, int(tokens or 0), float(dollars or 0.0))
                for name, tokens, dollars in connection.execute(statement)
            ]


def moment_from(value: str | None) -> float | None:
    """A moment as `/admin/usage` and `tandem usage` take it: Unix seconds or ISO 8601 (UTC unless it
    says otherwise); None for none given; ValueError naming both forms for anything else."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value[:60]!r} is neither ISO 8601 (2026-01-31T12:00:00Z) nor Unix seconds") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _fold(found: Iterable[Any]) -> list[dict[str, Any]]:
    out: dict[tuple, dict[str, Any]] = {}
    for row in found:
        key = (int(row.period), row.tenant, row.model, row.variant)
        entry = out.setdefault(
            key,
            {
                "period_start": key[0], "tenant": row.tenant, "model": row.model, "variant": row.variant,
                "requests": 0, "requests_by_status": {}, "prompt_tokens": 0, "completion_tokens": 0,
                "replica_seconds": 0.0, "dollars": 0.0,
            },
        )  # fmt: skip
        if row.status:
            entry["requests_by_status"][str(row.status)] = int(row.requests)
        entry["requests"] += int(row.requests)
        entry["prompt_tokens"] += int(row.prompt_tokens)
        entry["completion_tokens"] += int(row.completion_tokens)
        entry["replica_seconds"] += float(row.replica_seconds)
        entry["dollars"] += float(row.dollars)
    return list(out.values())
