"""What the edge answers when something fails: never internals, always something to act on.

- ``EdgeErrors`` (the outermost ASGI middleware) gives every request an id — the caller's
  ``X-Request-ID`` when it is sane, else a new one — sent back as ``X-Request-ID`` on every
  response and written in every log line about the request. An exception nothing handled
  answers ``500 {"detail": "internal error", "request_id": …}``: no traceback, no exception
  text; those go to the log with the id. Every ``503`` leaves with a ``Retry-After``.
- ``install_error_handlers`` maps the failures of what the edge depends on to ``503``: the
  broker (``KafkaException``, ``BufferError``, ``ProduceError``), the key service
  (``SealingError``), a store or a socket (``OSError``). A ``RequestValidationError`` answers
  ``422`` with the fields named and the offending input echoed only when short and printable
  (a lone surrogate would make the 422 itself fail to encode).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from confluent_kafka import KafkaException
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streams.entropy import random_uuid_hex
from streams.free_text import describe, trace_of
from streams.producer import ProduceError
from streams.sealing import KeyErased, OpenFailed, SealingError

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"
RETRY_AFTER_S = 2
"""Seconds a ``503`` asks the caller to wait (``Retry-After``) when its route did not say."""

_SANE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
ECHO_CHARS = 200
"""Longest input a 422 echoes back; a longer one is cut."""


def request_id(scope: Scope) -> str:
    """The id of the request in ``scope`` (set by ``EdgeErrors``; ``-`` outside it)."""
    return str(scope.get("state", {}).get("request_id", "-"))


class EdgeErrors:
    """Request ids, the catch-all 500, and ``Retry-After`` on every 503."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = Headers(scope=scope).get(REQUEST_ID_HEADER, "")
        rid = incoming if _SANE_ID.match(incoming) else random_uuid_hex()
        scope.setdefault("state", {})["request_id"] = rid
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                headers[REQUEST_ID_HEADER] = rid
                if message["status"] == 503 and "retry-after" not in headers:
                    headers["Retry-After"] = str(RETRY_AFTER_S)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            # Described with where it was raised, not its message: it may echo the body.
            log.error("request %s: %s %s failed: %s\n%s", rid, scope.get("method"),
                      scope.get("path"), describe(exc), trace_of(exc))
            if started:  # mid-response (a stream): the server can only cut the connection
                raise
            body = {"detail": "internal error", "request_id": rid}
            await JSONResponse(body, status_code=500)(scope, receive, send_with_id)


class ErrorOut(BaseModel):
    """An error the edge answers: what went wrong, in words (never internals)."""

    detail: str
    request_id: str | None = None


_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again.",
                                "schema": {"type": "integer", "minimum": 1}}}

_JSON = {"application/json": {"schema": ErrorOut.model_json_schema()}}
"""Errors are JSON on every route, a streaming one's too (not its ``text/event-stream``)."""

EDGE_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"content": _JSON, "description": "No bearer token, or one that fails a check "
                                           "(signature, expiry, audience, issuer, claims)."},
    403: {"content": _JSON, "description": "The caller's role in the active tenant lacks the "
                                           "route's capability, or X-Tenant-ID names a tenant "
                                           "the caller is not a member of."},
    413: {"content": _JSON, "description": "The body (or the record it would make) is over "
                                           "the limit the detail names."},
    503: {"content": _JSON, "headers": _RETRY_AFTER,
          "description": "The broker, the key service or the identity provider is unavailable; "
                         "retry after Retry-After seconds (nothing was recorded, or a retry "
                         "with the same Idempotency-Key is answered as the first)."},
}
"""What every authenticated route may answer besides its own codes (OpenAPI ``responses``)."""


def unavailable(what: str) -> JSONResponse:
    """The 503 of a dependency that failed: what to wait for, and when to try again."""
    return JSONResponse({"detail": f"{what} is unavailable; try again"}, status_code=503,
                        headers={"Retry-After": str(RETRY_AFTER_S)})


async def _broker(request: Request, exc: Exception) -> JSONResponse:
    log.warning("request %s: the broker failed: %s: %s", request_id(request.scope),
                type(exc).__name__, exc)
    if isinstance(exc, ProduceError) and exc.too_large:
        return JSONResponse({"detail": "the broker refuses a record this large; send less"},
                            status_code=413)
    return unavailable("the broker")


async def _key_service(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, KeyErased):  # content of an erased conversation: gone, not failing
        return JSONResponse({"detail": str(exc)}, status_code=404)
    if isinstance(exc, OpenFailed):  # content that does not open is a fault, not an outage
        raise exc
    log.warning("request %s: the key service failed: %s: %s", request_id(request.scope),
                type(exc).__name__, exc)
    return unavailable("the key service")


async def _store(request: Request, exc: Exception) -> JSONResponse:
    log.warning("request %s: a store or service failed: %s: %s", request_id(request.scope),
                type(exc).__name__, exc)
    return unavailable("a store or service the edge depends on")


async def _invalid(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": [_safe_error(e) for e in exc.errors()]}, status_code=422)


def _safe_error(error: dict[str, Any]) -> dict[str, Any]:
    """A validation error fit to send back: its texts encodable, the input and context
    echoed only when scalar, cut at ``ECHO_CHARS``."""
    out: dict[str, Any] = {
        "type": _text(str(error.get("type", "invalid"))),
        "loc": [part if isinstance(part, int) else _text(str(part))
                for part in error.get("loc", ())],
        "msg": _text(str(error.get("msg", "")), limit=2 * ECHO_CHARS),
    }
    if "input" in error and (echo := _scalar(error["input"])) is not _NOT_SCALAR:
        out["input"] = echo
    ctx = error.get("ctx")
    if isinstance(ctx, dict):
        out["ctx"] = {_text(str(k)): v if (v := _scalar(val)) is not _NOT_SCALAR
                      else _text(str(val)) for k, val in ctx.items()}
    return out


_NOT_SCALAR = object()


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):  # beyond 64 bits, as text: clients' JSON numbers are doubles
        return value if -(2**63) <= value < 2**64 else _text(str(value))
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _text(value)
    return _NOT_SCALAR


def _text(value: str, limit: int = ECHO_CHARS) -> str:
    """``value`` cut at ``limit`` characters, a lone surrogate written as its escape."""
    cut = value[:limit].encode("utf-8", "backslashreplace").decode("utf-8")
    return cut + ("…" if len(value) > limit else "")


def install_error_handlers(app: FastAPI) -> None:
    """Map validation errors and the failures of the edge's dependencies (see the module)."""
    app.add_exception_handler(RequestValidationError, _invalid)
    for broker_error in (KafkaException, BufferError, ProduceError):
        app.add_exception_handler(broker_error, _broker)
    app.add_exception_handler(SealingError, _key_service)
    app.add_exception_handler(OSError, _store)
