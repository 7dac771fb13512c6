"""When the edge last had work: a request came in, or its tail applied records.

``NoteRequests`` (an ASGI middleware, the outermost) notes when each HTTP request comes in,
and passes everything through untouched (it wraps neither ``receive`` nor ``send``, so an
event stream's writes do not pass through it). The tail notes when it last applied records
(``EdgeTail.applied_at``). ``streams.heap.collect_when_idle`` runs the edge's full garbage
collection once neither has happened for a while.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send


@dataclass
class LastRequest:
    """``time.monotonic()`` when the last HTTP request came in (0.0: none yet)."""

    at: float = 0.0


class NoteRequests:
    """Notes in ``last`` when each HTTP request comes in."""

    def __init__(self, app: ASGIApp, last: LastRequest) -> None:
        self.app = app
        self.last = last

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.last.at = time.monotonic()
        await self.app(scope, receive, send)
