"""Where telemetry rows go: a small ``TelemetryStore`` port and its two ClickHouse adapters.

* embedded (default): ClickHouse in-process through clickhouse-connect's chDB backend, data in
  ``<state_dir>/clickhouse``. chDB locks that folder, so exactly one process — the telemetry
  sink — may open it; other processes query through the sink's loopback endpoint
  (``telemetry.query``).
* server: ``VOICE_CLICKHOUSE_URL=http://host:8123`` (user, password and database may ride in the
  URL). Any number of sinks and readers may connect.

Both are the same clickhouse-connect client class family, so the SQL is the same everywhere;
``ClickHouseStore`` wraps either and is what the sink and ``voice sql`` talk to.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import clickhouse_connect
from clickhouse_connect.driver.exceptions import OperationalError
from pydantic import Field

from streams.settings import VoiceSettings


class TelemetrySettings(VoiceSettings):
    """``VoiceSettings`` plus what the telemetry sink and ``voice sql`` read."""

    clickhouse_url: str | None = None
    """``http://[user:password@]host:8123[/database]`` of a ClickHouse server; unset = embedded."""
    telemetry_batch_rows: int = Field(default=30_000, ge=1)
    """Insert a batch when it holds this many Kafka records …"""
    telemetry_flush_ms: int = Field(default=1_000, ge=1)
    """… or when its oldest record has waited this long and the insert before it is done.
    (Each insert costs ClickHouse ~50 ms besides its rows, so under load batches grow to
    ``telemetry_batch_rows``; ~80 MB of Python objects at that size, two batches at most.)"""
    telemetry_eager_rows: int = Field(default=5_000, ge=0)
    """… or, when the sink is catching up (a batch's first record was older than the flush
    time when taken), as soon as it holds this many and the inserter is free (0 = never):
    through a backlog the inserter never waits for a batch's age while the loop fills it."""
    telemetry_query_port: int = Field(default=8124, ge=0, le=65535)
    """Loopback port of the sink's read-only SQL endpoint (embedded store only; 0 = off)."""
    telemetry_retry_max_s: float = Field(default=10.0, gt=0)
    """Longest wait between two attempts of an insert while ClickHouse is unavailable."""


def telemetry_settings(settings: VoiceSettings | None = None) -> TelemetrySettings:
    """``TelemetrySettings`` from the environment, keeping every value of ``settings``.

    The CLI hands over plain ``VoiceSettings`` (with the bootstrap of a running ``voice up``
    filled in); the telemetry fields are then read from ``VOICE_*`` here.
    """
    if isinstance(settings, TelemetrySettings):
        return settings
    if settings is None:
        return TelemetrySettings()
    return TelemetrySettings(**settings.model_dump())


class StoreUnavailable(Exception):
    """The store cannot be opened or did not take a call; retrying later may help."""


def store_error(exc: BaseException) -> str:
    """A store's failure for a dead letter or a log line: its type, and ClickHouse's error code
    or the connection's message — never a refusal's text, which may quote the rows' values."""
    code = _code(exc)
    if code is None and unavailable(exc):  # a connection's failure: no rows in its message
        return f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ + (f" (ClickHouse code {code})" if code is not None else "")


STORE_AT_FAULT = frozenset({
    159,  # TIMEOUT_EXCEEDED
    164,  # READONLY (a server in read-only mode)
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    209,  # SOCKET_TIMEOUT
    210,  # NETWORK_ERROR
    236,  # ABORTED
    241,  # MEMORY_LIMIT_EXCEEDED
    242,  # TABLE_IS_READ_ONLY
    243,  # NOT_ENOUGH_SPACE (a full disk)
    252,  # TOO_MANY_PARTS (inserts faster than merges)
    394,  # QUERY_WAS_CANCELLED
    999,  # KEEPER_EXCEPTION
})
"""ClickHouse error codes that say the store is failing as a whole, not that it refuses these
rows: the same rows go in once it recovers, so they are waited for, never dead-lettered."""


def _code(exc: BaseException) -> int | None:
    found = re.search(r"\bCode: (\d+)", str(exc))
    return int(found.group(1)) if found else None


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached or is failing as a whole (wait for
    it), rather than that it answered and refused what it was given (a record it will refuse
    again). A full disk is the first: before, its refusals dead-lettered every record."""
    if isinstance(exc, (StoreUnavailable, OperationalError, ConnectionError, TimeoutError)):
        return True
    return _code(exc) in STORE_AT_FAULT


@dataclass
class QueryResult:
    """Rows of a query, with column names and ClickHouse type names."""

    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)


class TelemetryStore(Protocol):
    """The port the sink and ``voice sql`` use; the adapters differ only in how they connect."""

    location: str
    """``chdb://<path>`` or the server URL without its password, for messages."""

    def command(self, sql: str) -> None:
        """Run DDL or any statement without a result."""

    def insert(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        token: str | None = None,
    ) -> None:
        """Insert rows; the same ``token`` twice inserts once (deduplication window)."""

    def insert_arrow(self, table: str, data: Any, token: str | None = None) -> None:
        """Insert an Arrow table (columns by name) with the views it feeds; the same ``token``
        twice inserts once, in the table and in every view's target."""

    def query(self, sql: str) -> QueryResult:
        """Rows of a query."""

    def close(self) -> None:
        """Release the connection (for chDB: let another path be opened in this process)."""


def embedded_path(settings: VoiceSettings) -> Path:
    """The folder the embedded ClickHouse owns."""
    return Path(settings.state_dir).resolve() / "clickhouse"


def _redacted(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)


class ClickHouseStore:
    """A ``TelemetryStore`` over a clickhouse-connect client (chDB-backed or HTTP).

    A lock serialises calls: the sink thread and the query endpoint's threads may share one
    process, and a clickhouse-connect client is not meant for concurrent calls.
    """

    def __init__(self, client: Any, location: str) -> None:
        self._client = client
        self._lock = threading.Lock()
        self.location = location

    def command(self, sql: str) -> None:
        with self._lock:
            self._client.command(sql)

    def insert(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        token: str | None = None,
    ) -> None:
        if not rows:
            return
        # The token makes a retried insert of the same batch a no-op on MergeTree tables with
        # non_replicated_deduplication_window > 0 (set in telemetry.schema).
        settings = {"insert_deduplication_token": token} if token else None
        with self._lock:
            self._client.insert(table, list(rows), column_names=list(columns), settings=settings)

    def insert_arrow(self, table: str, data: Any, token: str | None = None) -> None:
        if not data.num_rows:
            return
        # Dependent views deduplicate too, or a retried block would reach their tables twice
        # (the landing table is Null: it keeps no block to compare with).
        settings: dict[str, Any] = {"deduplicate_blocks_in_dependent_materialized_views": 1}
        if token:
            settings["insert_deduplication_token"] = token
        with self._lock:
            self._client.insert_arrow(table, data, settings=settings)

    def query(self, sql: str) -> QueryResult:
        with self._lock:
            res = self._client.query(sql)
            types = [t.name for t in res.column_types]
            out = QueryResult(list(res.column_names), types, list(res.result_rows))
            if not out.columns:
                # An empty result in Native format has no block, hence no header; ask for the
                # header alone so an empty table still prints its columns.
                try:
                    desc = self._client.query(f"DESCRIBE ({sql})").result_rows
                    out.columns, out.types = [d[0] for d in desc], [d[1] for d in desc]
                except Exception:  # SHOW … and the like cannot be described; no header then
                    pass
            return out

    def close(self) -> None:
        with self._lock:
            self._client.close()


def open_store(settings: VoiceSettings, readonly: bool = False) -> ClickHouseStore:
    """The store the settings name: the server of ``clickhouse_url``, else embedded chDB.

    ``readonly`` opens a client that can only read: ``readonly=1`` for chDB (set once on its
    own handle; it then refuses writes, DDL, table functions and any change of settings), and
    ``readonly=2`` for HTTP, where clickhouse-connect sends its own settings with each request
    and ``readonly=1`` would refuse those too.
    """
    ts = telemetry_settings(settings)
    try:
        if ts.clickhouse_url:
            client = clickhouse_connect.get_client(
                dsn=ts.clickhouse_url, settings={"readonly": 2} if readonly else None
            )
            return ClickHouseStore(client, _redacted(ts.clickhouse_url))
        path = embedded_path(ts)
        path.mkdir(parents=True, exist_ok=True)
        client = clickhouse_connect.get_client(
            dsn=f"chdb://{path}", settings={"readonly": 1} if readonly else None
        )
        return ClickHouseStore(client, f"chdb://{path}")
    except Exception as exc:  # connection refused, folder locked by another process, …
        where = ts.clickhouse_url and _redacted(ts.clickhouse_url) or f"chdb://{embedded_path(ts)}"
        raise StoreUnavailable(f"cannot open the telemetry store {where}: {exc}") from exc
