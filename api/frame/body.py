"""The request body, read once at the edge before anything else looks at it.

``BodyGuard`` (ASGI middleware) reads every request's body itself, counting bytes as they
arrive — with a ``Content-Length`` or without one (chunked) — and answers 413 naming the limit
the moment it is passed, before the body is parsed and before any dependency (the token
included) runs. Only then does the app see the request, its body replayed from memory.

Each route kind has one named limit (``BodyLimit``): every route takes ``VOICE_MAX_BODY_BYTES``
but those the app factory maps to their own (the CSV upload). A JSON body that is not valid
UTF-8 is re-encoded with each undecodable byte as a ``\\udcXX`` escape (Python's
``surrogateescape``), so the field holding it fails validation like any lone surrogate: 422
naming the field, not a 400 about the whole body, never a 500.

Past the limit the rest of the body is read only to be dropped, for at most ``LINGER_S`` and
``LINGER_BYTES``, and then answered: a client still writing its body (httpx, curl without
``Expect``) reads the 413 instead of a reset. (Closing with the rest unread made the kernel
reset the connection, and the reset could reach the client before it read the answer.) A body
that ended within those bounds leaves the connection open for the next request; one that did
not, or a length declared past them, or a client waiting for ``100 Continue``, is answered at
once and the connection closed.

It must never keep more than the limit, nor let the app run before the body is complete.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LINGER_S = 2.0
"""The longest a refused body's rest is read (and dropped) before the 413 is sent anyway."""

LINGER_BYTES = 32 * 1024 * 1024
"""The most a refused body's rest is read past its limit (and dropped) before the 413: ~10 ms
of the edge's CPU (0.3 ms a MB measured on ``make up``), enough for an accidental photo or
document."""


@dataclass(frozen=True)
class BodyLimit:
    """The largest body a kind of route reads, and what sets it (named in the 413)."""

    max_bytes: int
    setting: str
    """What sets it, named in the 413: ``VOICE_MAX_BODY_BYTES``, …"""

    @property
    def detail(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes ({self.setting})"

    def refusal(self, close: bool = True) -> JSONResponse:
        """The 413; ``close`` when the rest of the body is left unread."""
        return JSONResponse({"detail": self.detail}, status_code=413,
                            headers={"Connection": "close"} if close else None)


class BodyGuard:
    """Reads each HTTP request's body up to its route's ``BodyLimit`` (``by_path``, else
    ``default``), then hands the app the request with the body replayed."""

    def __init__(self, app: ASGIApp, default: BodyLimit,
                 by_path: Mapping[str, BodyLimit] | None = None) -> None:
        self.app = app
        self.default = default
        self.by_path = dict(by_path or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.by_path.get(scope["path"], self.default)
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit.max_bytes:
            if (int(declared) > limit.max_bytes + LINGER_BYTES
                    or headers.get("expect", "").lower() == "100-continue"):
                await limit.refusal()(scope, receive, send)  # nothing read, nothing to wait for
            else:
                await _refuse(limit, 0, scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: no one to answer
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit.max_bytes:
                if message.get("more_body", False):
                    await _refuse(limit, size, scope, receive, send)
                else:
                    await limit.refusal(close=False)(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if body and _is_json(headers.get("content-type")):
            escaped = surrogate_escaped(body)
            if escaped is not None:
                body = escaped
                scope = {**scope, "headers": [
                    *((k, v) for k, v in scope["headers"] if k.lower() != b"content-length"),
                    (b"content-length", str(len(body)).encode())]}
        await self.app(scope, _replay(body, receive), send)


async def _refuse(limit: BodyLimit, read: int, scope: Scope, receive: Receive,
                  send: Send) -> None:
    """Reads and drops the rest of a body refused after ``read`` bytes, within ``LINGER_S``
    and ``LINGER_BYTES`` past the limit, then answers 413: keeping the connection when the body
    ended, closing it when it did not; not at all when the client went away."""
    allowance = limit.max_bytes + LINGER_BYTES - read
    ended = False
    try:
        async with asyncio.timeout(LINGER_S):
            while allowance >= 0 and not ended:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return
                allowance -= len(message.get("body", b""))
                ended = not message.get("more_body", False)
    except TimeoutError:
        pass
    await limit.refusal(close=not ended)(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` giving ``body`` once, then the client's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def surrogate_escaped(body: bytes) -> bytes | None:
    """``body`` (JSON that is not valid UTF-8) with each undecodable byte in a string as a
    ``\\udcXX`` escape; None when it is valid UTF-8. A body that is not JSON either comes
    back with U+FFFD for each undecodable byte, for the app's parser to answer as any
    malformed JSON (422 at the position), rather than fail to decode it (400)."""
    try:
        body.decode("utf-8")
        return None
    except UnicodeDecodeError:
        pass
    try:
        doc = json.loads(body.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return body.decode("utf-8", "replace").encode("utf-8")
    # ensure_ascii writes every lone surrogate as its escape: the result is ASCII.
    return json.dumps(doc, separators=(",", ":")).encode("ascii")
