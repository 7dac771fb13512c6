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

It must never read more than the limit, nor let the app run before the body is complete.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


@dataclass(frozen=True)
class BodyLimit:
    """The largest body a kind of route reads, and what sets it (named in the 413)."""

    max_bytes: int
    setting: str
    """What sets it, named in the 413: ``VOICE_MAX_BODY_BYTES``, …"""

    @property
    def detail(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes ({self.setting})"

    def refusal(self) -> JSONResponse:
        """The 413; the connection closes, since the rest of the body is left unread."""
        return JSONResponse({"detail": self.detail}, status_code=413,
                            headers={"Connection": "close"})


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
            await limit.refusal()(scope, receive, send)
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
                await limit.refusal()(scope, receive, send)
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
