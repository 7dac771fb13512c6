"""``voice sql``: read-only SQL on the telemetry store, rendered as a table, JSON or CSV.

chDB locks its folder, so while the sink runs no other process can open the embedded store.
The sink therefore serves a tiny read-only endpoint on loopback (``QueryServer``; POST the SQL
to ``http://127.0.0.1:<telemetry_query_port>/``) and ``run_sql`` asks it first. With no sink
running, ``run_sql`` opens the embedded store itself; with ``VOICE_CLICKHOUSE_URL`` it asks the
server directly. Every path runs on a read-only client (the engine enforces it: no writes, no
DDL, no table functions, no changing settings); the statement check here only gives a clear
message early.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import threading
import urllib.error
import urllib.request
from datetime import UTC, date, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from uuid import UUID

from streams.readonly_sql import SqlRefused, check_read_only
from streams.settings import VoiceSettings
from telemetry.store import (
    ClickHouseStore,
    QueryResult,
    StoreUnavailable,
    TelemetrySettings,
    open_store,
    telemetry_settings,
)

log = logging.getLogger(__name__)

Format = Literal["table", "json", "csv"]
MAX_SQL_BYTES = 1 << 20


class QueryFailed(RuntimeError):
    """The store refused or failed the query; the message is ClickHouse's."""


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if isinstance(v, datetime):
        # chDB returns naive values for DateTime64('UTC') columns; they are UTC.
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).isoformat()
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, (Decimal, UUID)):
        return str(v)
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(v).decode("ascii")
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    return str(v)


def result_json(res: QueryResult) -> dict[str, Any]:
    return {"columns": res.columns, "types": res.types,
            "rows": [[_jsonable(v) for v in row] for row in res.rows]}


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


class QueryServer:
    """Read-only SQL over HTTP on loopback, served by the process that owns the store.

    ``POST /`` with the SQL as body → 200 ``{"columns", "types", "rows"}``, 400 refused or
    failed (``{"error"}``), 409 when the caller expects another store (header
    ``X-Voice-Store``), so ``voice sql`` of one state folder never reads another's sink.
    ``GET /`` → ``{"store": location}``.
    """

    def __init__(self, settings: VoiceSettings, store: ClickHouseStore, port: int | None = None
                 ) -> None:
        ts = telemetry_settings(settings)
        self.store = store
        self._httpd = ThreadingHTTPServer(("127.0.0.1", ts.telemetry_query_port
                                           if port is None else port), self._handler())
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={
            "poll_interval": 0.2}, name="voice-sql", daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:  # not to stderr
                log.debug("voice-sql %s", fmt % args)

            def _send(self, status: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc, ensure_ascii=False).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, {"store": server.store.location})

            def do_POST(self) -> None:  # noqa: N802
                want = self.headers.get("X-Voice-Store")
                if want and want != server.store.location:
                    return self._send(409, {"error": f"this sink serves {server.store.location}",
                                            "store": server.store.location})
                size = int(self.headers.get("Content-Length") or 0)
                if size > MAX_SQL_BYTES:
                    return self._send(400, {"error": "statement too long"})
                sql = self.rfile.read(size).decode("utf-8", "replace")
                try:
                    res = server.store.query(check_read_only(sql))
                except SqlRefused as exc:
                    return self._send(400, {"error": str(exc)})
                except Exception as exc:
                    return self._send(400, {"error": f"{type(exc).__name__}: {exc}"})
                self._send(200, result_json(res))

        return Handler

    def start(self) -> QueryServer:
        self._thread.start()
        log.info("voice sql endpoint on 127.0.0.1:%d (%s)", self.port, self.store.location)
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        self.store.close()


class EndpointDown(Exception):
    """Nothing answers on the query port."""


def ask_endpoint(ts: TelemetrySettings, sql: str, location: str | None = None,
                 timeout: float = 60.0) -> dict[str, Any]:
    """The JSON result from a running sink's endpoint; ``EndpointDown`` when none answers."""
    req = urllib.request.Request(f"http://127.0.0.1:{ts.telemetry_query_port}/",
                                 data=sql.encode("utf-8"), method="POST",
                                 headers={"Content-Type": "text/plain"})
    if location:
        req.add_header("X-Voice-Store", location)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            doc = json.loads(exc.read())
        except ValueError:
            doc = {"error": str(exc)}
        if exc.code == 409:  # another state folder's sink holds the port
            raise EndpointDown(doc.get("error", "")) from None
        raise QueryFailed(doc.get("error", str(exc))) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise EndpointDown(str(exc)) from None


def run_sql(settings: VoiceSettings, sql: str, fmt: Format = "table") -> str:
    """Run one read-only statement on the telemetry store and render it.

    Order: ``VOICE_CLICKHOUSE_URL`` if set; else the running sink's loopback endpoint; else the
    embedded store opened directly (only possible while no sink holds it).
    Raises ``SqlRefused``, ``QueryFailed`` or ``StoreUnavailable`` with a readable message.
    """
    from telemetry.store import embedded_path

    if fmt not in ("table", "json", "csv"):
        raise ValueError(f"unknown format {fmt!r}: table, json or csv")
    statement = check_read_only(sql)
    ts = telemetry_settings(settings)
    if not ts.clickhouse_url:
        location = f"chdb://{embedded_path(ts)}"
        try:
            return render(ask_endpoint(ts, statement, location), fmt)
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
