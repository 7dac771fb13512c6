"""One deadline per request: every wait of the edge shares the request's gateway bound.

A route may wait for several things in turn — the broker's ack of its command, the writer's
acknowledgement, this edge's view catching up with the log — and each wait had its own
timeout, so their sum could pass the bound (``VOICE_GATEWAY_BOUND_S``) a gateway in front of
the edge enforces. ``RequestDeadline`` (an ASGI middleware) sets the request's deadline —
the bound, less a small margin to write the answer — and ``remaining(cap)`` gives each wait
the smaller of its own timeout and what is left. A wait cut short answers ``503`` with
``Retry-After``, never a ``202`` for a record that is not on the log.

It must never be used by a stream's own loop (``api.frame.sse`` ends streams before the
bound by itself): only by the waits of a request that answers once.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

from starlette.types import ASGIApp, Receive, Scope, Send

_DEADLINE: ContextVar[float | None] = ContextVar("voice_request_deadline", default=None)

MARGIN_S = 0.5
"""Left out of the bound (at most a tenth of it) for writing the answer after the last wait."""


def margin(bound_s: float) -> float:
    """Seconds of ``bound_s`` kept for writing the answer."""
    return min(MARGIN_S, bound_s / 10)


class RequestDeadline:
    """Sets the deadline of every HTTP request: now + ``bound_s`` − ``margin(bound_s)``."""

    def __init__(self, app: ASGIApp, bound_s: float) -> None:
        self.app = app
        self.bound_s = bound_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _DEADLINE.set(time.monotonic() + self.bound_s - margin(self.bound_s))
        try:
            await self.app(scope, receive, send)
        finally:
            _DEADLINE.reset(token)


def remaining(cap: float) -> float:
    """Seconds a wait may take: ``cap``, or less when the request's deadline comes first
    (0 once it has passed). Outside a request (a test, a script) it is ``cap``."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return cap
    return max(0.0, min(cap, deadline - time.monotonic()))


def cut_short(cap: float) -> bool:
    """Whether a wait of ``cap`` seconds is cut short by the request's deadline now."""
    return remaining(cap) < cap
