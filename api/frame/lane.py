"""The stream lane: held event streams served below FastAPI's routing.

A stream is held for the whole gateway bound, and everything its request set up stays alive
with it: under FastAPI's routing that is two ``AsyncExitStack``s, the dependencies' results
and generators, ``Request`` objects and the exception wrappers' frames — about 16 KiB of each
held stream's ~36 KiB (docs/benchmarks.md, "Streams per edge … second pass"). ``StreamLane``
(an ASGI middleware) answers the ``GET``s of the routes given to it itself: it validates the
query and headers the route declares (``StreamParams``: 422 naming the field) as ``open``
asks for them; ``open`` checks the caller the way the route's dependencies do,
through the same functions (``api.frame.deps.principal_from``, ``allowed``, ``owned_view``,
``api.frame.sse.served_cursor``), and returns the stream. An error answers through the app's
own exception handlers, as the route's would. Every other request goes on to the app.

The route stays declared in its router (its OpenAPI operation, and the whole route for an
app without the lane); ``tests/unit/test_stream_lane.py`` holds the lane's answers to the
route's, case by case. The lane must never serve a method or path its route does not.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from fastapi.exceptions import RequestValidationError
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.frame.models import HeaderText
from api.frame.sse import resume_cursor
from streams.ids import TENANT_PATTERN

M = TypeVar("M", bound=BaseModel)


class _Tenant(BaseModel):
    x_tenant_id: str | None = Field(None, pattern=TENANT_PATTERN)


class _Cursor(BaseModel):
    after: int | None = Field(None, ge=0)
    last_event_id: HeaderText | None = None


_WHERE = {"after": ("query", "after"), "last_event_id": ("header", "Last-Event-ID"),
          "x_tenant_id": ("header", "x-tenant-id")}


@dataclass(frozen=True)
class StreamParams:
    """The query and headers of a stream request, validated when asked for — in the order
    the route's dependencies would (the tenant before the token, the cursor after the
    resource): a bad one answers 422 naming it."""

    query: dict[str, str]
    headers: Headers

    @classmethod
    def of(cls, scope: Scope) -> StreamParams:
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                               keep_blank_values=True))
        return cls(query, Headers(scope=scope))

    @property
    def token(self) -> str | None:
        """The bearer token of ``Authorization`` (None: none, or another scheme)."""
        scheme, token = get_authorization_scheme_param(self.headers.get("authorization"))
        return token if scheme.lower() == "bearer" and token else None

    def tenant(self) -> str | None:
        """``X-Tenant-ID``, if sent (422 unless a tenant id)."""
        return _valid(_Tenant, x_tenant_id=self.headers.get("x-tenant-id")).x_tenant_id

    def cursor(self) -> int:
        """Where the stream resumes (``api.frame.sse.resume_cursor``)."""
        c = _valid(_Cursor, after=self.query.get("after"),
                   last_event_id=self.headers.get("last-event-id"))
        return resume_cursor(c.after, c.last_event_id)


def _valid(model: type[M], **raw: Any) -> M:
    try:
        return model.model_validate({k: v for k, v in raw.items() if v is not None})
    except ValidationError as exc:
        raise RequestValidationError([
            {**e, "loc": (*_WHERE[str(e["loc"][0])], *e["loc"][1:])}
            for e in exc.errors(include_url=False)]) from None


Open = Callable[[Request, dict[str, str], StreamParams], Awaitable[Response]]
"""A route's stream: the request, its path parameters and its parameters → the response."""


@dataclass(frozen=True)
class LaneRoute:
    """One stream route the lane serves: its path template (``{name}`` for a segment)."""

    path: str
    open: Open

    def match(self, path: str) -> dict[str, str] | None:
        m = _compiled(self.path).fullmatch(path)
        return None if m is None else m.groupdict()


def _compiled(template: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template)))


class StreamLane:
    """Serves the ``GET``s of ``routes`` itself (see the module); the rest goes to ``app``."""

    def __init__(self, app: ASGIApp, routes: list[LaneRoute]) -> None:
        self.app = app
        self.routes = list(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        matched = self._match(scope) if scope["type"] == "http" else None
        if matched is None:
            await self.app(scope, receive, send)
            return
        # Served here, in this frame: one less frame kept by every held stream.
        route, path = matched
        scope["route"] = route  # its template names the request's span
        request = Request(scope, receive, send)
        try:
            response = await route.open(request, path, StreamParams.of(scope))
        except Exception as exc:
            response = await _answer(request, exc)
        del request  # not kept for the stream's life
        await response(scope, receive, send)

    def _match(self, scope: Scope) -> tuple[LaneRoute, dict[str, str]] | None:
        if scope["method"] != "GET":
            return None
        for route in self.routes:
            found = route.match(scope["path"])
            if found is not None:
                return route, found
        return None


async def _answer(request: Request, exc: Exception) -> Response:
    """The app's own answer to ``exc`` (the handler of the nearest class of its MRO, as
    routes get); re-raised when it has none (``EdgeErrors``: 500 with the request id)."""
    handler = _handler_for(request, exc)
    if handler is None:
        raise exc
    response = handler(request, exc)
    if inspect.isawaitable(response):
        response = await response
    return response


def _handler_for(request: Request, exc: Exception
                 ) -> Callable[[Request, Exception], Response | Awaitable[Response]] | None:
    """The app's own handler of ``exc`` (the nearest class of its MRO), as routes get."""
    handlers = getattr(request.app, "exception_handlers", {})
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
