"""How the edge's HTTP server is built: uvicorn on httptools and uvloop, each with a fallback.

The edge's time under a fan-out is mostly the per-stream write (uvicorn's ``send``, the HTTP
writer, ``transport.write``): httptools (llhttp, in C) and uvloop (libuv) do both for less CPU
than h11 and asyncio's selector loop (docs/decisions/0012). Both are settings
(``VOICE_EDGE_HTTP``, ``VOICE_EDGE_LOOP``); a server whose module is missing falls back to
h11 / asyncio with a warning, never fails to start.

httptools reads a request head without any bound (a 50 MiB header line is buffered whole),
where h11 refuses one past 16 KiB. ``BoundedHttpTools`` keeps h11's bound: a head still
incomplete after ``HEAD_LIMIT_BYTES`` is answered 431 and the connection closed. This module
must never change what the app answers to a request within the bound.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from streams.settings import VoiceSettings

HEAD_LIMIT_BYTES = 16 * 1024
"""The largest request head (request line and headers) the edge reads: h11's own default
bound (``h11.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE``), kept under httptools."""

log = logging.getLogger("voice.edge.server")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def bounded_httptools() -> type[Any]:
    """uvicorn's httptools protocol with h11's bound on a request head (431 past it)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpTools(HttpToolsProtocol):
        """Refuses a request head past ``HEAD_LIMIT_BYTES`` with 431: a complete one by its
        size (the URL and every header line), one still arriving by the bytes of the reads
        that ended inside it — so the parser never buffers more than one read past the bound.
        (A read that also carries the end of the request before it counts whole: only a
        pipelining client is ever refused a little early.)"""

        # Slots, not the instance's dict: three more keys there grew it to its next size,
        # ~1.5 KiB more for every connection (tracemalloc, 2,000 held streams).
        __slots__ = ("_head_open", "_head_bytes", "_head_too_large")

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_open = False
            self._head_bytes = 0
            self._head_too_large = False

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_open = True

        def on_headers_complete(self) -> None:
            self._head_open, self._head_bytes = False, 0
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > HEAD_LIMIT_BYTES:
                self._head_too_large = True
                # Stops the parser: uvicorn answers its error with ``send_400_response``.
                raise ValueError(f"request head over {HEAD_LIMIT_BYTES} bytes")
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_open and not self.transport.is_closing():  # still inside a head
                self._head_bytes += len(data)
                if self._head_bytes > HEAD_LIMIT_BYTES:
                    self._head_too_large = True
                    self.send_400_response("")

        def send_400_response(self, msg: str) -> None:
            if not self._head_too_large:
                super().send_400_response(msg)
                return
            msg = f"request head over {HEAD_LIMIT_BYTES} bytes"
            self.logger.warning("Refused a request: %s.", msg)
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                 b"content-type: text/plain; charset=utf-8\r\n"
                                 b"content-length: " + str(len(msg)).encode() + b"\r\n"
                                 b"connection: close\r\n\r\n" + msg.encode())
            self.transport.close()

    return BoundedHttpTools


def server_options(settings: VoiceSettings) -> dict[str, Any]:
    """uvicorn's ``http``, ``loop`` and ``timeout_keep_alive`` for the edge, from the settings;
    an ``http`` or ``loop`` whose module is not installed falls back (h11, asyncio) with a
    warning."""
    http: Any = "h11"
    if settings.edge_http == "httptools":
        if _installed("httptools"):
            http = bounded_httptools()
        else:
            log.warning("VOICE_EDGE_HTTP=httptools but httptools is not installed: using h11")
    loop = "asyncio"
    if settings.edge_loop == "uvloop":
        if _installed("uvloop"):
            loop = "uvloop"
        else:
            log.warning("VOICE_EDGE_LOOP=uvloop but uvloop is not installed: using asyncio")
    return {"http": http, "loop": loop, "timeout_keep_alive": settings.edge_keep_alive_s}
