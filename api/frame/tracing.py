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

The span of an event stream ends when its response starts (the stream was opened, or not:
what the span is for), not when the stream does: a stream is held for the whole gateway bound,
and a span open that long is memory every held stream keeps (docs/benchmarks.md, "Streams
per edge … second pass"). So the span is started and ended by hand, not in a ``with`` block
whose frames would live as long as the request.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streams.tracing import extract, failed, tracer


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
        span = tracer().start_span(method, context=extract(headers), kind=SpanKind.SERVER,
                                   attributes={"http.request.method": method})
        token = otel_context.attach(trace.set_span_in_context(span))
        del headers

        async def send_traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    failed(span, str(status))
                if _is_event_stream(message):
                    _end(span, method, scope)
            await send(message)

        try:
            await self.app(scope, receive, send_traced)
        except BaseException as exc:
            failed(span, type(exc).__qualname__)
            raise
        finally:
            otel_context.detach(token)
            _end(span, method, scope)


def _end(span: Span, method: str, scope: Scope) -> None:
    """End ``span``, named for the route that served the request (once: later calls pass)."""
    if not span.is_recording():
        return
    route = _route_of(scope)
    if route is not None:
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
    span.end()


def _is_event_stream(start: Message) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
               for k, v in start.get("headers", ()))


def _route_of(scope: Scope) -> str | None:
    """The template of the route that served the request (Starlette puts it in the scope)."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else None
