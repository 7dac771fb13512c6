"""A caught-up stream takes a new event in the tail's hand-over (its push), not by being woken
to look — and declines whenever anything but events is due, so the stream's own loop does that
as before (``api.frame.sse``, ``api.frame.projection.Changes``; docs/benchmarks.md, "Issue 14,
eighth pass")."""

from __future__ import annotations

import asyncio
import re
from functools import partial
from typing import Any

from fastapi.sse import ServerSentEvent
from starlette.types import Message

from api.conversations.routes import conversation_events
from api.conversations.views import ConversationViews
from api.frame.projection import Changes
from api.frame.sse import EventStream, Feed, StreamEnd, event_stream, sse_stream
from schemas.conversation import ConversationStarted, TurnStateChanged
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer
from tests.unit.test_frame import Streams  # its views: events that are their own cursor


def render(e: int) -> ServerSentEvent | None:
    if e == 13:
        raise StreamEnd("end; unlucky")
    return None if e % 2 == 0 else ServerSentEvent(event="n", id=str(e), data={"n": e})


def feed_of(streams: Streams, **kw: Any) -> Feed[int]:
    return Feed(view=lambda: streams.get("k"), render=render,
                wait=partial(streams.changed, "k"), **kw)


class Client:
    """An ASGI server's side of one stream: what was sent, and a window that, when closed,
    makes ``send`` wait before it writes (as uvicorn's flow control does)."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.window = asyncio.Event()
        self.window.set()
        self._gone = asyncio.Event()

    async def send(self, message: Message) -> None:
        if not self.window.is_set():
            await self.window.wait()
        self.sent.append(message)

    async def receive(self) -> Message:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    def serve(self, response: EventStream) -> asyncio.Task[None]:
        return asyncio.create_task(response({"type": "http"}, self.receive, self.send))

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent
                        if m["type"] == "http.response.body")

    def ids(self) -> list[int]:
        return [int(i) for i in re.findall(rb"^id: (\d+)$", self.body, re.M)]

    @property
    def ended(self) -> bool:
        return any(m["type"] == "http.response.body" and not m.get("more_body")
                   for m in self.sent)


async def until(pred: Any, limit: float = 5.0) -> None:
    async with asyncio.timeout(limit):
        while not pred():
            await asyncio.sleep(0.001)


async def caught_up(**feed: Any) -> tuple[Streams, Client, asyncio.Task[None]]:
    """Stream ``k`` (event 1 on it) served to a client that has that event, its stream
    waiting for the next; ``feed``: more of the ``Feed``'s fields."""
    streams = Streams()
    streams.add("k", 1)
    client = Client()
    task = client.serve(event_stream(sse_stream(feed_of(streams, **feed), 0, bound_s=30)))
    await until(lambda: client.ids() == [1] and streams.waiting("k") == 1)
    return streams, client, task


# --- a key's waiters --------------------------------------------------------------------------


async def test_a_change_is_offered_to_a_waiters_push_first_and_wakes_it_only_if_declined(
) -> None:
    changes = Changes()
    takes = [True]
    offered = 0

    def push() -> bool:
        nonlocal offered
        offered += 1
        return takes[0]

    wait = asyncio.create_task(changes.wait("k", lambda: False, 5, push))
    plain = asyncio.create_task(changes.wait("k", lambda: True, 5))
    await asyncio.sleep(0)
    plain_done = plain.done()  # its predicate held at once: it never waited
    changes.notify("k")
    await asyncio.sleep(0.01)
    assert offered == 1 and not wait.done() and changes.waiting("k") == 1, "taken: asleep"
    assert plain_done
    changes.notify("k")
    assert offered == 2 and changes.waiting("k") == 1
    takes[0] = False
    changes.notify("k")  # declined: woken, and its predicate (still False) puts it back
    await asyncio.sleep(0.01)
    assert offered == 3 and not wait.done() and changes.waiting("k") == 1
    wait.cancel()
    await asyncio.gather(wait, return_exceptions=True)
    assert changes.waiting("k") == 0, "a cancelled wait leaves nothing behind"


async def test_one_notify_wakes_the_waiters_that_decline_and_keeps_those_that_take_it() -> None:
    changes = Changes()
    offered: list[str] = []

    def push(name: str, takes: bool) -> Any:
        def offer() -> bool:
            offered.append(name)
            return takes
        return offer

    moved = {"a": False, "b": False, "c": False}
    waits = {n: asyncio.create_task(changes.wait("k", lambda n=n: moved[n], 5, push(n, takes)))
             for n, takes in (("a", True), ("b", False), ("c", True))}
    plain = asyncio.create_task(changes.wait("k", lambda: moved["a"], 5))
    await asyncio.sleep(0)
    assert changes.waiting("k") == 4
    moved["b"] = True
    changes.notify("k")
    assert offered == ["a", "b", "c"], "every push offered, in the order they came"
    assert changes.waiting("k") == 2, "the two that took it sleep on; the rest are woken"
    assert await waits["b"] is True
    await asyncio.sleep(0.01)
    assert not plain.done() and changes.waiting("k") == 3, "the plain waiter waits again"
    changes.notify("k")
    assert offered == ["a", "b", "c", "a", "c"] and changes.waiting("k") == 2
    for t in (waits["a"], waits["c"], plain):
        t.cancel()
    await asyncio.gather(waits["a"], waits["c"], plain, return_exceptions=True)
    assert changes.waiting("k") == 0


# --- the stream's push ------------------------------------------------------------------------


async def test_a_caught_up_stream_writes_a_new_event_in_the_hand_over_without_waking() -> None:
    streams, client, task = await caught_up()
    streams.add("k", 3)
    # Written by the notify itself: no turn of the loop has run since.
    assert client.ids() == [1, 3] and streams.waiting("k") == 1
    streams.add("k", 4, 5)  # 4 is not for clients: skipped, its id passed
    streams.add("k", 7)
    assert client.ids() == [1, 3, 5, 7] and not task.done()
    await asyncio.sleep(0.01)
    assert client.ids() == [1, 3, 5, 7], "each event once"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert streams.waiting("k") == 0


async def test_a_write_that_waits_for_the_client_keeps_the_order_and_loses_nothing() -> None:
    streams, client, task = await caught_up()
    client.window.clear()  # the client stops reading
    streams.add("k", 3)  # taken: its write waits for the window
    streams.add("k", 5)  # declined while that write drains: the stream wakes, and waits too
    streams.add("k", 7)
    await asyncio.sleep(0.05)
    assert client.ids() == [1], "nothing written past a full window"
    client.window.set()
    await until(lambda: client.ids()[-1:] == [7])
    streams.add("k", 9)
    await until(lambda: client.ids()[-1:] == [9])
    assert client.ids() == [1, 3, 5, 7, 9], "in order, each once"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_final_comment_or_a_failed_rendering_is_left_to_the_stream_itself() -> None:
    streams, client, task = await caught_up(
        ends_after=lambda e, _c: "end; seven" if e == 7 else None)
    streams.add("k", 3, 7)  # 7 ends the stream: the push declines, the stream sends both
    await asyncio.wait_for(task, 5)
    assert client.ids() == [1, 3, 7] and client.body.endswith(b": end; seven\n\n")
    assert client.ended

    streams, client, task = await caught_up()
    streams.add("k", 13)  # its rendering ends the stream: raised in the stream, not the tail
    await asyncio.wait_for(task, 5)
    assert client.ids() == [1] and client.body.endswith(b": end; unlucky\n\n")


async def test_a_stream_without_a_response_waits_as_before() -> None:
    streams = Streams()
    streams.add("k", 1)
    seen: list[str | None] = []

    async def read() -> None:
        async for sse in sse_stream(feed_of(streams), 0, bound_s=30):
            seen.append(sse.id if isinstance(sse, ServerSentEvent) else None)

    task = asyncio.create_task(read())
    await until(lambda: seen == ["1"] and streams.waiting("k") == 1)
    streams.add("k", 3)
    assert seen == ["1"], "no outlet: nothing written by the notify"
    await until(lambda: seen == ["1", "3"])
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# --- the conversation stream, as the edge serves it -------------------------------------------


async def test_a_conversation_stream_gets_a_turn_event_in_the_views_apply() -> None:
    views = ConversationViews()
    views.apply(Envelope(record=ConversationStarted(conversation="cnv-1", owner="alice"),
                         key="cnv-1", source="/t", seq=1, tenant="default"))
    client = Client()
    task = client.serve(event_stream(conversation_events(
        views, Sealer(MemoryKeyStore()), "cnv-1", 1, bound_s=30)))
    await until(lambda: views.waiting("cnv-1") == 1)
    views.apply(Envelope(record=TurnStateChanged(conversation="cnv-1", turn="cnv-1:t2",
                                                 state="Replied"),
                         key="cnv-1", source="/t", seq=2, tenant="default"))
    assert b"event: turn" in client.body and client.ids() == [2]
    assert views.waiting("cnv-1") == 1, "not woken"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
