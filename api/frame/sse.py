"""The one Server-Sent-Events loop of the edge, and where a stream resumes.

Every stream (a conversation's log, an assistant conversation's display events, an inbox) has
the same contract: ``id:`` is the stream's cursor (its seq); a client resumes with ``after=N``
or ``Last-Event-ID: N`` (the query wins) and gets every event after N once, in order, then
live ones. Comments carry no id: keep-alives after ``KEEPALIVE_S`` of silence, and a final one
before the gateway bound saying where to resume. A cursor older than this edge keeps is served
from the log when the stream can read it there (``Feed.older``: a conversation's log); else it
answers 409 with the oldest cursor it can serve (``api.app`` renders ``CursorTooOld``), and a
client that falls that far behind while connected gets a final comment instead. Streams differ
only in their ``Feed``: what they render per event and when they end early.

A feed may render an event as its wire bytes (``sse_frame``) rather than a ``ServerSentEvent``:
then the bytes are written as they are, so a view that renders each event once
(``KeptEvents.render_once``) serves every stream of it the same bytes — no model, no
formatting per stream.
"""

import asyncio
import json
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Depends, Header, Query
from fastapi.exceptions import RequestValidationError
from fastapi.sse import EventSourceResponse, ServerSentEvent, format_sse_event
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from api.frame.models import CursorTooOldOut, HeaderText
from api.frame.projection import CursorTooOld, KeptEvents
from schemas.base import json_bytes

KEEPALIVE_S = 5.0
"""Silence after which a keep-alive comment is sent (a third of the bound, if smaller)."""
END_MARGIN_S = 1.0
"""The stream ends this long before the gateway bound (a third of the bound, if smaller)."""
TOO_OLD = {409: {"description": "The cursor is older than this edge keeps; reconnect with "
                                "after=oldest_cursor.",
                 "content": {"application/json": {"schema": CursorTooOldOut.model_json_schema()}}}}
"""The 409 of every route that takes a resume cursor, for the OpenAPI document."""
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

E = TypeVar("E")

Frame = bytes
"""One event (or comment) as it goes on the wire: ``sse_frame`` of a ``ServerSentEvent``."""


class StreamEnd(Exception):  # noqa: N818 - control flow, not a failure
    """Ends a stream at once with ``comment`` (the conversation was erased, …)."""

    def __init__(self, comment: str) -> None:
        super().__init__(comment)
        self.comment = comment


def resume_cursor(after: int | None, last_event_id: str | None) -> int:
    """Where an SSE stream resumes: ``after`` wins over ``Last-Event-ID``; 0 from the start.

    A ``Last-Event-ID`` that is not a non-negative integer answers 422 naming the header.
    """
    if after is not None:
        return after
    if last_event_id is None or not last_event_id.strip():
        return 0
    try:
        value = int(last_event_id.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise RequestValidationError([{
            "type": "int_parsing", "loc": ("header", "Last-Event-ID"), "input": last_event_id,
            "msg": "Last-Event-ID must be a non-negative integer (an event id of this stream)",
        }])
    return value


def served_cursor(view: KeptEvents[Any], cursor: int) -> int:
    """``cursor``, if ``view`` still keeps every event after it; else ``CursorTooOld`` with
    the oldest cursor it can serve (→ 409)."""
    oldest = view.oldest_cursor()
    if cursor < oldest:
        raise CursorTooOld(view.stream_name, cursor, oldest)
    return cursor


def cursor_dependency(view_of: Callable[..., Any], reads_older: bool = False
                      ) -> Callable[..., Awaitable[int]]:
    """A dependency: where a stream of the view ``view_of`` gives starts (``after`` query or
    ``Last-Event-ID`` header); ``CursorTooOld`` (→ 409) when this edge cannot serve it —
    never when ``reads_older``: the stream reads what the view no longer keeps from the log
    (its ``Feed.older``)."""

    async def stream_cursor(
        view: Annotated[KeptEvents[Any], Depends(view_of)],
        after: Annotated[int | None, Query(ge=0, description="Resume after this seq (an event "
                                                              "id); wins over Last-Event-ID."
                                           )] = None,
        last_event_id: Annotated[HeaderText | None, Header(alias="Last-Event-ID")] = None,
    ) -> int:
        cursor = resume_cursor(after, last_event_id)
        return cursor if reads_older else served_cursor(view, cursor)

    return stream_cursor


@dataclass
class Feed(Generic[E]):
    """What one stream reads and how it renders it; the loop does the rest."""

    view: Callable[[], KeptEvents[E] | None]
    """The stream's view now; None once it is gone (then the stream ends with ``gone``)."""
    render: Callable[[E], ServerSentEvent | Frame | None]
    """The SSE event of one kept event (or its wire bytes, ``sse_frame``), or None for one
    clients do not see (its id is skipped); may raise ``StreamEnd``."""
    wait: Callable[..., Awaitable[bool]]
    """Waits (at most the timeout) until the predicate holds, re-checked on every change;
    called with a third argument, a ``Push`` (``Projection.changed``), when the stream can
    write a change itself (it has an ``Outlet``)."""
    gone: str = "end; the stream is gone"
    ends_after: Callable[[E, int], str | None] = lambda _event, _cursor: None
    """A final comment to end with right after sending ``event`` (e.g. its turn is done)."""
    idle: Callable[[], bool] = lambda: False
    """Whether to end once every kept event is sent (e.g. no turn runs any more)."""
    idle_end: str = "end; idle"
    """The final comment when ``idle`` ends the stream (the resume cursor follows it)."""
    render_live: Callable[[Any], ServerSentEvent | None] | None = None
    """The SSE event (no ``id:``) of one transient event of the view (``KeptEvents.live``);
    None: the stream sends none. A new stream sends every transient event still held."""
    older: Callable[[int, int],
                    Awaitable[list[tuple[int, ServerSentEvent | Frame | None]]]] | None = None
    """For a cursor older than the view keeps: the events after the first cursor up to the
    second, read from the log, as (cursor, SSE event or None), every cursor once and in
    order; raises ``StreamEnd`` when they cannot be read. None: such a cursor ends the stream
    (and answers 409 at its start)."""
    hold: Callable[[], AbstractContextManager[object]] = nullcontext
    """Held for as long as the stream runs (e.g. its view is not evicted meanwhile)."""


class EventSource:
    """The events of one stream (``sse_stream``): an async iterator of them, and the
    ``outlet`` its response gives it once the response has started (``EventStream``)."""

    def __init__(self, feed: Feed[Any], cursor: int, bound_s: float) -> None:
        self.outlet: Outlet | None = None
        self._events = _events(self, feed, cursor, bound_s)

    def __aiter__(self) -> AsyncIterator[ServerSentEvent | Frame]:
        return self._events

    def __anext__(self) -> Awaitable[ServerSentEvent | Frame]:
        return self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()


def sse_stream(feed: Feed[E], cursor: int, bound_s: float) -> EventSource:
    """The events of ``feed`` after ``cursor`` (``id:`` = cursor), then live ones, ending
    before ``bound_s`` with a comment saying where to resume.

    While the stream is caught up and waits, a change is first offered to its push (when its
    response gave it an ``Outlet``): the new events rendered and written there and then, in
    the tail's hand-over, without waking the stream — unless anything but events is due (a
    final comment, a transient event, the end, an old cursor, a write still draining, a
    failure): then the push declines and the stream wakes and does it all as before."""
    return EventSource(feed, cursor, bound_s)


async def _events(source: EventSource, feed: Feed[E], cursor: int, bound_s: float
                  ) -> AsyncIterator[ServerSentEvent | Frame]:
    with feed.hold():  # the whole stream's life, in this one generator
        loop = asyncio.get_running_loop()
        end_at = loop.time() + bound_s - min(END_MARGIN_S, bound_s / 3)
        keepalive = min(KEEPALIVE_S, bound_s / 3)
        last_sent = loop.time()
        live_sent = 0
        live = feed.render_live is not None

        def moved() -> bool:  # read while the loop below waits: its cursor and live_sent then
            v = feed.view()
            return (v is None or v.head() > cursor or feed.idle()
                    or (live and v.live_head > live_sent))

        def push() -> bool:  # see ``sse_stream``; runs on the loop while the stream waits
            nonlocal cursor, last_sent
            outlet = source.outlet
            try:
                v = feed.view()
                now = loop.time()
                if (outlet is None or outlet.draining or v is None or now >= end_at
                        or feed.idle() or (live and v.live_head > live_sent)):
                    return False
                head = v.head()
                frames: list[bytes] = []
                at = cursor
                for event in v.events_after(cursor):
                    sse = feed.render(event)
                    at = v.cursor_of(event)
                    if feed.ends_after(event, at) is not None:
                        return False
                    if sse is not None:
                        frames.append(wire(sse))
                if frames and not outlet.write(b"".join(frames)):
                    return False
            except Exception:  # noqa: BLE001 - the woken stream meets it where it can end
                return False
            cursor = max(at, head)
            if frames:
                last_sent = now
            return True

        try:
            while True:
                view = feed.view()
                if view is None:
                    yield ServerSentEvent(comment=feed.gone)
                    return
                try:
                    events = view.events_after(cursor)
                    # Taken with the events, before any yield: while the client reads, the tail
                    # may apply more, and those must be sent, not passed over.
                    head = view.head()
                except CursorTooOld as exc:  # this client fell behind what the edge keeps
                    if feed.older is None:
                        yield ServerSentEvent(comment=f"end; cursor {cursor} is too old, the "
                                                      f"oldest this edge serves is {exc.oldest}")
                        return
                    remaining = end_at - loop.time()
                    if remaining <= 0:
                        break
                    try:  # read from the log; the read goes on for a reconnect if this ends first
                        older = await asyncio.wait_for(feed.older(cursor, exc.oldest), remaining)
                    except TimeoutError:
                        break
                    for older_cursor, sse in older:
                        if loop.time() >= end_at:
                            break
                        cursor = older_cursor
                        if sse is not None:
                            yield sse
                            last_sent = loop.time()
                    continue
                for event in events:
                    if loop.time() >= end_at:
                        break
                    sse = feed.render(event)
                    cursor = view.cursor_of(event)
                    if sse is not None:
                        yield sse
                        last_sent = loop.time()
                    if (final := feed.ends_after(event, cursor)) is not None:
                        yield ServerSentEvent(comment=final)
                        return
                if live and loop.time() < end_at:
                    # After the kept events: a transient event the log has since completed was
                    # dropped from the view when the completing event was applied.
                    live_head = view.live_head  # before any yield, as ``head`` above
                    for n, item in view.live_after(live_sent):
                        live_sent = n
                        if (sse := feed.render_live(item)) is not None:
                            yield sse
                            last_sent = loop.time()
                    # Numbers the view dropped (their turn completed) are passed too: else the
                    # wait below would see them as news for ever and spin, starving the loop.
                    live_sent = max(live_sent, live_head)
                now = loop.time()
                if now >= end_at:
                    break
                # Positions the view had passed without an event (a notification seen before) too.
                cursor = max(cursor, head)
                if feed.idle():
                    yield ServerSentEvent(comment=f"{feed.idle_end}; resume with after={cursor}")
                    return
                if now - last_sent >= keepalive:
                    yield ServerSentEvent(comment="keep-alive")
                    last_sent = now

                timeout = max(0.0, min(end_at, last_sent + keepalive) - now)
                if source.outlet is None:
                    await feed.wait(moved, timeout)
                else:  # the push moves cursor and last_sent; the wait re-reads them
                    await feed.wait(moved, timeout, push)
        except StreamEnd as end:
            yield ServerSentEvent(comment=end.comment)
            return
        yield ServerSentEvent(comment=f"end; reconnect with after={cursor}")


def model_json(model: BaseModel) -> str:
    """``model.model_dump_json()``, the same text (``json_bytes``: without its wrapper), on
    every event an edge renders."""
    return json_bytes(model).decode()


def sse_data(sse: ServerSentEvent) -> str | None:
    """The ``data:`` text of ``sse``: its ``raw_data`` (already JSON), a model's JSON, or
    other data as compact JSON."""
    if sse.raw_data is not None:
        return sse.raw_data
    if sse.data is None:
        return None
    if isinstance(sse.data, BaseModel):
        return model_json(sse.data)
    return json.dumps(sse.data, ensure_ascii=False, separators=(",", ":"))


def sse_frame(sse: ServerSentEvent) -> Frame:
    """The wire bytes of ``sse``: the framing FastAPI gives a generator's events."""
    if sse.retry is None and sse.comment is None:
        return event_frame_bytes(sse_data(sse), sse.event, sse.id)
    return format_sse_event(data_str=sse_data(sse), event=sse.event, id=sse.id,
                            retry=sse.retry, comment=sse.comment)


def event_frame_bytes(data: str | None, event: str | None, id: str | None) -> Frame:
    """``format_sse_event(data_str=data, event=event, id=id)``, the same bytes.

    An event's data is compact JSON, which has no line break, so its frame is one string
    (0.15 µs against FastAPI's 0.58, on every event of every stream); data with a line break
    goes to FastAPI's framing, which splits it into ``data:`` lines."""
    if data is not None and ("\n" in data or "\r" in data):
        return format_sse_event(data_str=data, event=event, id=id)
    return "".join((
        "" if event is None else f"event: {event}\n",
        "" if data is None else f"data: {data}\n",
        "" if id is None else f"id: {id}\n",
        "\n",
    )).encode()


def wire(sse: ServerSentEvent | Frame) -> bytes:
    """The wire bytes of one event of a stream: a ``Frame`` as it is (rendered once for every
    stream that sends it), a ``ServerSentEvent`` framed as FastAPI frames a generator's."""
    return sse if isinstance(sse, bytes) else sse_frame(sse)


class Outlet:
    """Where a stream's push writes (``sse_stream``): its response's ``send``, called from
    the loop's current step rather than the stream's task.

    ASGI's ``send`` is a coroutine, but a server waits in it only while the client's window
    is full (uvicorn waits for the window, then writes to the transport), so ``write`` runs
    it to its first wait at once: usually to its end, the body written. If it waits, the
    rest (the wait, then the write) runs as a task that the stream's own next write awaits
    first (``settled``) and every push declines meanwhile (``draining``): the writes stay in
    order, and a slow client still holds its stream back, not the edge.
    """

    def __init__(self, send: Send) -> None:
        self._send = send
        self._draining: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        """Whether an earlier write still waits for the client (then pushes decline)."""
        return self._draining is not None and not self._draining.done()

    def write(self, body: bytes) -> bool:
        """Send ``body`` (more to come); False if it was not written (``send`` raised before
        it wrote: the stream's own send meets that again)."""
        step = self._send({"type": "http.response.body", "body": body, "more_body": True})
        try:
            waits_on = step.send(None)
        except StopIteration:
            return True
        except Exception:  # noqa: BLE001 - see the docstring
            return False
        self._draining = asyncio.ensure_future(_resume(step, waits_on))
        return True

    async def settled(self) -> None:
        """Once an earlier write has drained (its failure raised here, in the stream)."""
        if self._draining is not None:
            draining, self._draining = self._draining, None
            await draining

    def close(self) -> None:
        if self._draining is not None:
            self._draining.cancel()


async def _resume(step: Any, waits_on: Any) -> None:
    """Run the coroutine ``step`` on from the wait it stopped at (what it yielded), as an
    asyncio task would: a future it yielded is marked taken (the task protocol's
    ``_asyncio_future_blocking``) and awaited, then the coroutine is resumed."""
    while True:
        try:
            if waits_on is None:  # a bare yield: one turn of the loop
                await asyncio.sleep(0)
            else:
                waits_on._asyncio_future_blocking = False
                await waits_on
        except BaseException as exc:  # noqa: BLE001 - into the coroutine, as a task would
            try:
                waits_on = step.throw(exc)
            except StopIteration:
                return
            continue
        try:
            waits_on = step.send(None)
        except StopIteration:
            return


class EventStream(EventSourceResponse):
    """An ``EventSourceResponse`` that watches for the client's going with one plain task.

    Starlette's streaming response does it with an anyio task group (two task handles, a
    cancel scope, their events and weak sets): ~6 KiB of every held stream, for a watch this
    does with one task. The stream runs in the request's task; when the client goes, the
    watcher cancels it, and that one cancellation is taken back — any other (the server
    stopping) still ends the request.

    It writes its events itself (``wire``), not through Starlette's body iterator, and gives
    an ``EventSource`` the ``Outlet`` its pushes write to.
    """

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        events: AsyncIterable[ServerSentEvent | Frame] = self.body_iterator  # type: ignore[assignment]
        outlet = None
        if isinstance(events, EventSource):  # its pushes may write between its events
            outlet = events.outlet = Outlet(send)
        try:
            async for sse in events:
                if outlet is not None:
                    await outlet.settled()
                await send({"type": "http.response.body", "body": wire(sse), "more_body": True})
            if outlet is not None:
                await outlet.settled()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if outlet is not None:
                outlet.close()

    ended: Callable[[], None] | None = None
    """Called once the response is over, however it ends (the stream lane's slot release)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        streaming = asyncio.current_task()
        assert streaming is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            streaming.cancel()

        watcher = asyncio.create_task(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone or streaming.uncancel() > 0:
                raise
        finally:
            watcher.cancel()
            if self.ended is not None:
                self.ended()
        if self.background is not None:
            await self.background()


def event_stream(events: AsyncIterator[ServerSentEvent | Frame],
                 headers: dict[str, str] | None = None,
                 ended: Callable[[], None] | None = None) -> EventStream:
    """The response of a stream route: ``events`` written straight to the connection.

    Not FastAPI's generator path: that runs two more tasks per stream (a producer and a
    keep-alive inserter, joined by two memory streams, with a cancel scope per event) — a
    third of the edge loop's time per event and a share of each idle stream's memory, for
    keep-alives this loop already sends (docs/benchmarks.md, "Streams per edge"). The
    request's dependencies (its stream slot) still end after the response does; ``ended``
    is called then too.
    """
    response = EventStream(events, headers={**SSE_HEADERS, **(headers or {})})
    response.ended = ended
    return response
