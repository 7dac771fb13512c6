"""The edge's span of every HTTP request: where a trace enters Voice.

``TraceRequests`` (an ASGI middleware, the outermost) continues the caller's W3C
``traceparent`` (and ``tracestate``) when the request has one and starts a new trace when it
has not, and keeps the request's server span current while the route runs: every record the
route produces carries its ``traceparent`` (``streams.envelope``), so the worker's spans, down
to the model and tool calls, join the caller's trace. A malformed ``traceparent`` is ignored
(a new trace), never an error.

The span's name is ``{method} {route}`` (the route's template, never the path with its ids);
its attributes are the HTTP semantic conventions' method, route and status — never a query,
a header's value or a body.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import SpanKind
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streams.tracing import continued, failed


class TraceRequests:
    """A server span per HTTP request, continuing the request's trace context."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method", "GET"))
        headers = [(k.decode("latin-1"), v) for k, v in scope.get("headers", ())]
        with continued(method, headers, kind=SpanKind.SERVER,
                       attributes={"http.request.method": method}) as span:

            async def send_traced(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        failed(span, str(status))
                await send(message)

            try:
                await self.app(scope, receive, send_traced)
            finally:
                route = _route_of(scope)
                if route is not None:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)


def _route_of(scope: Scope) -> str | None:
    """The template of the route that served the request (Starlette puts it in the scope)."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else None
