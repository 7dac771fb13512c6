"""``voice sql``: read-only SQL on the telemetry store, rendered as a table, JSON or CSV.

chDB locks its folder, so while the sink runs no other process can open the embedded store; the
sink serves a read-only endpoint on loopback instead (``telemetry.endpoint``), which requires a
token granting ``telemetry.query``. ``run_sql`` asks that endpoint first, with the caller's
token (``VOICE_TOKEN`` or ``--token``) or, in dev/test with the built-in dev secret, an
``analyst`` token it mints for a few minutes. With no sink running it opens the embedded store
itself (whoever can read the folder can read the data; no token adds anything there); with
``VOICE_CLICKHOUSE_URL`` it asks the server directly, with the server's own credentials.

Every path runs one statement passed by ``streams.readonly_sql.check_read_only`` on a
``readonly=1`` client: the check refuses what readonly lets through (``file()``, ``url()``, a
second statement, ``INTO OUTFILE``); readonly refuses writes, DDL and changed settings.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Literal

from streams.readonly_sql import SqlRefused, check_read_only
from streams.settings import DEV_JWT_SECRET, VoiceSettings
from streams.tokens import mint_token
from telemetry.endpoint import EndpointDown, EndpointRefused, ask_endpoint, result_json
from telemetry.store import (
    QueryResult,
    StoreUnavailable,
    embedded_path,
    open_store,
    telemetry_settings,
)

Format = Literal["table", "json", "csv"]
DEV_TOKEN_TTL_S = 300
"""Lifetime of the analyst token ``voice sql`` mints for itself in dev/test."""
__all__ = ["QueryFailed", "SqlRefused", "check_read_only", "client_token", "render", "run_sql"]


class QueryFailed(RuntimeError):
    """The store or the sink's endpoint refused or failed the query; the message says why."""


def render(res: QueryResult | dict[str, Any], fmt: Format = "table") -> str:
    """The result as aligned columns, a JSON array of objects, or CSV with a header row."""
    data = result_json(res) if isinstance(res, QueryResult) else res
    cols, rows = data["columns"], data["rows"]
    if fmt == "json":
        objs = [json.dumps(dict(zip(cols, r, strict=True)), ensure_ascii=False) for r in rows]
        return "[\n" + ",\n".join(objs) + "\n]" if objs else "[]"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if v is None else _cell(v) for v in r])
        return buf.getvalue().rstrip("\n")
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}: table, json or csv")
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    numeric = [bool(rows) and all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool)
                                  or r[i] is None for r in rows) for i in range(len(cols))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    out = [line(list(cols)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, (list, dict)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def client_token(settings: VoiceSettings, token: str | None = None) -> str | None:
    """The token ``voice sql`` shows the endpoint: the one given (``--token`` or
    ``VOICE_TOKEN``), else in dev/test with the built-in dev secret a short-lived ``analyst``
    token minted here, else None (the endpoint will answer 401; see ``run_sql``)."""
    if token and token.strip():
        return token.strip()
    if settings.env in ("dev", "test") and (
            settings.jwt_secret.get_secret_value() == DEV_JWT_SECRET):
        return mint_token(settings, "voice-sql", "analyst", ttl_s=DEV_TOKEN_TTL_S)
    return None


def _endpoint_failure(exc: EndpointRefused, token: str | None) -> QueryFailed:
    if exc.status == 401 and token is None:
        return QueryFailed(
            "the telemetry sink's query endpoint needs a token whose role grants "
            "telemetry.query (analyst or operator): set VOICE_TOKEN or pass --token "
            "(only dev/test with the built-in dev secret mint one themselves)")
    if exc.status in (401, 403):
        return QueryFailed(f"the telemetry sink's query endpoint refused the token: {exc}")
    return QueryFailed(str(exc))


def run_sql(settings: VoiceSettings, sql: str, fmt: Format = "table",
            token: str | None = None) -> str:
    """Run one read-only statement on the telemetry store and render it.

    Order: ``VOICE_CLICKHOUSE_URL`` if set; else the running sink's loopback endpoint (with
    ``client_token(settings, token)``); else the embedded store opened directly (only possible
    while no sink holds it). Raises ``SqlRefused``, ``QueryFailed`` or ``StoreUnavailable``
    with a readable message.
    """
    if fmt not in ("table", "json", "csv"):
        raise ValueError(f"unknown format {fmt!r}: table, json or csv")
    statement = check_read_only(sql)
    ts = telemetry_settings(settings)
    if not ts.clickhouse_url:
        location = f"chdb://{embedded_path(ts)}"
        bearer = client_token(ts, token)
        try:
            return render(ask_endpoint(ts, statement, bearer, location), fmt)
        except EndpointRefused as exc:
            raise _endpoint_failure(exc, bearer) from None
        except EndpointDown:
            pass  # no sink of this store running: open it ourselves
    try:
        store = open_store(ts, readonly=True)
    except StoreUnavailable as exc:
        raise StoreUnavailable(
            f"{exc}\n(is a telemetry sink running on this folder with its query endpoint "
            f"off? it listens on 127.0.0.1:{ts.telemetry_query_port})"
        ) from None
    try:
        return render(store.query(statement), fmt)
    except Exception as exc:
        raise QueryFailed(f"{type(exc).__name__}: {exc}") from None
    finally:
        store.close()
