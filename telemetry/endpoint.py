"""The sink's read-only SQL endpoint on loopback: the server (``QueryServer``) and its one
client (``ask_endpoint``), kept together so the protocol is written in one place.

chDB locks its folder, so while the sink runs no other process can open the embedded store;
``voice sql`` asks this endpoint instead. Loopback is not a trust boundary: every local user and
every web page open in a local browser can reach it. So a request must

* be ``POST /query`` with ``Content-Type: application/json`` and a ``Content-Length`` within
  ``MAX_BODY_BYTES`` (413 otherwise, before anything else is read);
* carry no ``Origin`` and no ``Sec-Fetch-Site`` other than ``none``, and name a loopback
  ``Host``: a browser adds those to anything a page sends (a form post, a ``fetch`` without
  preflight, a DNS-rebound page), so a page can never drive it. No CORS header is ever sent, so
  a preflight never succeeds either;
* carry ``Authorization: Bearer <token>``, the edge's tokens (``streams.tokens``), whose role in
  some membership grants ``telemetry.query`` (401 without a valid token, 403 without it);
* hold ``{"sql": "<one read statement>"}``, passed by ``streams.readonly_sql.check_read_only``
  and run on a ``readonly=1`` client.

Answers are JSON: ``{"columns", "types", "rows"}`` or ``{"error"}``; never a traceback, never the
token. The server must never die of a request: each runs in its own thread under a socket
timeout, at most ``MAX_CONCURRENT`` at once, and any failure ends only that request.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import urllib.error
import urllib.request
from datetime import UTC, date, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, ValidationError

from streams.capabilities import resolve_capabilities
from streams.readonly_sql import SqlRefused, check_read_only
from streams.settings import VoiceSettings
from streams.tokens import AuthError, Claims, KeysUnavailable, decode_claims
from telemetry.store import ClickHouseStore, QueryResult, TelemetrySettings, telemetry_settings

log = logging.getLogger(__name__)

QUERY_PATH = "/query"
MAX_BODY_BYTES = 1 << 20
"""Largest request body; larger answers 413 unread."""
MAX_CONCURRENT = 8
"""Requests served at once; more are answered 503 at once (a slow client holds a slot)."""
REQUEST_TIMEOUT_S = 10.0
"""A client that sends nothing for this long is dropped (its body, its next byte)."""
CAPABILITY = "telemetry.query"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


class QueryRequest(BaseModel):
    """The body of ``POST /query``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sql: str
    """One read statement (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, EXISTS)."""


class Refused(Exception):
    """A request the endpoint will not run; ``status`` and the message are the answer."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


# -- the wire format ---------------------------------------------------------------------------

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
    """A query result as the endpoint answers it: ``{"columns", "types", "rows"}``."""
    return {"columns": res.columns, "types": res.types,
            "rows": [[_jsonable(v) for v in row] for row in res.rows]}


# -- the checks, in the order the server makes them ---------------------------------------------

def refuse_cross_site(headers: Any) -> None:
    """``Refused(403)`` for anything a browser sent on a page's behalf (see the module doc)."""
    if headers.get("Origin") is not None:
        raise Refused(403, "requests from a web page (with an Origin header) are refused")
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site.strip().lower() != "none":
        raise Refused(403, f"requests from a web page (Sec-Fetch-Site: {site[:40]!r}) are "
                           "refused")
    host = headers.get("Host")
    if host is not None:  # browsers always send it; a DNS-rebound page names its own domain
        host = host.strip().lower()
        name = host[:host.find("]") + 1] if host.startswith("[") else host.split(":", 1)[0]
        if name not in _LOOPBACK_HOSTS:
            raise Refused(403, "the Host header must name 127.0.0.1 or localhost")


def body_length(headers: Any) -> int:
    """The declared body size: ``Refused`` 415 for another content type, 411 without a
    ``Content-Length`` (chunked bodies are not read), 413 over ``MAX_BODY_BYTES``."""
    ctype = (headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        raise Refused(415, "Content-Type must be application/json: "
                           '{"sql": "<one read statement>"}')
    if headers.get("Transfer-Encoding") is not None:
        raise Refused(411, "send the body with a Content-Length, not Transfer-Encoding")
    raw = headers.get("Content-Length")
    try:
        size = int(raw) if raw is not None else -1
    except ValueError:
        size = -1
    if size < 0:
        raise Refused(411, "a Content-Length header is required")
    if size > MAX_BODY_BYTES:
        raise Refused(413, f"the body is {size} bytes; the limit is {MAX_BODY_BYTES}")
    return size


def authorize(settings: VoiceSettings, authorization: str | None) -> Claims:
    """The claims of a bearer token granting ``telemetry.query`` in some membership;
    ``Refused`` 401 without a valid token, 403 without the capability."""
    challenge = {"WWW-Authenticate": 'Bearer realm="voice-sql"'}
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, "Authorization: Bearer <token> is required (a token whose role "
                           f"grants {CAPABILITY})", challenge)
    try:
        claims = decode_claims(settings, token.strip())
    except AuthError as exc:
        message = str(exc) if token.strip() not in str(exc) else "invalid token"
        raise Refused(401, message, challenge) from None
    except KeysUnavailable as exc:  # the identity provider's keys: not the caller's fault
        raise Refused(503, str(exc), {"Retry-After": str(exc.retry_after_s)}) from None
    roles = claims.member_roles(settings.default_tenant).values()
    if not any(CAPABILITY in resolve_capabilities(role) for role in roles):
        raise Refused(403, f"the token's roles ({', '.join(sorted(set(roles)))}) do not grant "
                           f"{CAPABILITY}; operator and analyst do")
    return claims


def parse_body(body: bytes) -> str:
    """The checked statement of a ``QueryRequest`` body, or ``Refused(400)`` saying why."""
    try:
        text = body.decode("utf-8")
        request = QueryRequest.model_validate_json(text)
        request.sql.encode("utf-8")  # a lone surrogate ("\ud800") passes JSON, not UTF-8
    except UnicodeError:
        raise Refused(400, "the body is not valid UTF-8") from None
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                          for e in exc.errors()[:3])
        raise Refused(400, f'the body must be {{"sql": "<statement>"}} ({where})') from None
    try:
        return check_read_only(request.sql)
    except SqlRefused as exc:
        raise Refused(400, str(exc)) from None


# -- the server --------------------------------------------------------------------------------

class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            try:  # tiny, into a fresh socket's buffer: never blocks the accepting thread
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\n"
                                b"Content-Type: application/json\r\nContent-Length: 30\r\n\r\n"
                                b'{"error": "too many requests"}')
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # starts the request's thread
        except BaseException:
            self.slots.release()  # no thread to release it (could not start one)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanished or stalled; the default prints a traceback to stderr.
        log.debug("voice-sql: request from %s ended early", client_address, exc_info=True)


class QueryServer:
    """Read-only SQL over HTTP on loopback, served by the process that owns the store.

    ``POST /query`` (see the module doc) → 200 ``{"columns", "types", "rows"}``; 400 refused
    or failed, 401/403 token, 409 when the caller expects another store (header
    ``X-Voice-Store``, so ``voice sql`` of one state folder never reads another's sink),
    411/413/415 body, 404/405 anything but ``POST /query``; always ``{"error"}``.
    """

    def __init__(self, settings: VoiceSettings, store: ClickHouseStore, port: int | None = None,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.settings = telemetry_settings(settings)
        self.store = store
        self.request_timeout_s = request_timeout_s
        self._httpd = _Server(("127.0.0.1", self.settings.telemetry_query_port
                               if port is None else port), self._handler())
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={
            "poll_interval": 0.2}, name="voice-sql", daemon=True)

    def answer(self, method: str, path: str, headers: Any, read: Any) -> dict[str, Any]:
        """The result of one request, or ``Refused``; ``read(n)`` reads the body."""
        if path.split("?", 1)[0] != QUERY_PATH:
            raise Refused(404, f"not found: the endpoint is POST {QUERY_PATH}")
        if method != "POST":
            raise Refused(405, f"only POST {QUERY_PATH}", {"Allow": "POST"})
        refuse_cross_site(headers)
        size = body_length(headers)
        claims = authorize(self.settings, headers.get("Authorization"))
        want = headers.get("X-Voice-Store")
        if want and want != self.store.location:
            raise Refused(409, f"this sink serves {self.store.location}")
        body = read(size)
        if len(body) != size:
            raise Refused(400, f"the body ended after {len(body)} of {size} bytes")
        statement = parse_body(body)
        log.debug("voice-sql: %s runs %d bytes", claims.sub, len(statement))
        try:
            return result_json(self.store.query(statement))
        except Exception as exc:  # the engine's refusal or failure: the analyst needs it
            raise Refused(400, f"{type(exc).__name__}: {exc}") from None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = server.request_timeout_s  # per socket: a stalled client ends its thread
            server_version = "voice-sql"
            sys_version = ""

            def log_message(self, fmt: str, *args: Any) -> None:  # not to stderr
                log.debug("voice-sql %s", fmt % args)

            def _send(self, status: int, doc: dict[str, Any],
                      headers: dict[str, str] | None = None) -> None:
                body = json.dumps(doc, ensure_ascii=False).encode("utf-8", "replace")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def _serve(self) -> None:
                self.close_connection = True  # one request per connection, always
                try:
                    doc = server.answer(self.command, self.path, self.headers, self.rfile.read)
                except Refused as exc:
                    if exc.status >= 401:
                        log.info("voice-sql: %s %s refused %d: %s", self.command,
                                 self.path[:80], exc.status, exc)
                    return self._send(exc.status, {"error": str(exc)}, exc.headers)
                except (TimeoutError, ConnectionError):
                    return  # the client stalled or left: nobody to answer
                except Exception:
                    log.exception("voice-sql: unexpected failure")
                    return self._send(500, {"error": "internal error (see the sink's log)"})
                self._send(200, doc)

            # Every method reaches answer(), which refuses all but POST with a JSON error.
            do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

        return Handler

    def start(self) -> QueryServer:
        self._thread.start()
        log.info("voice sql endpoint on 127.0.0.1:%d%s (%s)", self.port, QUERY_PATH,
                 self.store.location)
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        self.store.close()


# -- the client --------------------------------------------------------------------------------

class EndpointDown(Exception):
    """Nothing answers on the query port (or another state folder's sink does)."""


class EndpointRefused(Exception):
    """The endpoint refused the request; ``status`` and the endpoint's message say why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def ask_endpoint(ts: TelemetrySettings, sql: str, token: str | None,
                 location: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """The JSON result from a running sink's endpoint.

    ``EndpointDown`` when none answers (or one of another store does), ``EndpointRefused``
    when it refuses the request or the statement.
    """
    body = json.dumps({"sql": sql}, ensure_ascii=False).encode("utf-8")
    req = urllib.request.Request(f"http://127.0.0.1:{ts.telemetry_query_port}{QUERY_PATH}",
                                 data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if location:
        req.add_header("X-Voice-Store", location)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = str(json.loads(exc.read())["error"])
        except (ValueError, KeyError, TypeError, OSError):
            message = f"HTTP {exc.code}"
        if exc.code == 409:  # another state folder's sink holds the port
            raise EndpointDown(message) from None
        raise EndpointRefused(exc.code, message) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise EndpointDown(str(exc)) from None
