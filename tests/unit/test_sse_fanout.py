"""The pieces of the edge's fan-out that issue 14 made cheaper, held to what they must still do
(docs/benchmarks.md, "Streams per edge"): a key's waiters (one future and one timer each),
the stream response that watches for the client's going with one plain task, and the wire
bytes of an event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from fastapi.sse import ServerSentEvent
from pydantic import BaseModel
from starlette.types import Message

from api.conversations import render
from api.conversations.models import (
    AgentMessageEvent,
    DeltaEvent,
    ParticipantMessageEvent,
    ProposalEvent,
    TurnEvent,
)
from api.conversations.views import ConversationViews
from api.frame.projection import RENDERED_KEPT, Changes
from api.frame.sse import EventStream, Frame, StreamEnd, model_json, sse_frame, wire
from schemas.conversation import (
    ConversationErased,
    ConversationStarted,
    MessageRecorded,
    ProposalRecorded,
    ReplyRecorded,
    TurnRequested,
    TurnStateChanged,
)
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer

# --- a key's waiters ---------------------------------------------------------------------------


async def test_a_notify_wakes_every_waiter_of_its_key_and_no_other() -> None:
    changes = Changes()
    moved = {"a": False, "b": False}
    waits = [asyncio.create_task(changes.wait(k, lambda k=k: moved[k], 5))
             for k in ("a", "a", "b")]
    await asyncio.sleep(0)
    assert changes.waiting("a") == 2 and changes.waiting("b") == 1
    moved["a"] = True
    changes.notify("a")
    assert await asyncio.gather(*waits[:2]) == [True, True]
    assert changes.waiting("a") == 0 and not waits[2].done()
    changes.notify("b")  # woken, but its predicate does not hold: it waits again
    await asyncio.sleep(0.01)
    assert not waits[2].done() and changes.waiting("b") == 1
    waits[2].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waits[2]
    assert changes.waiting("b") == 0, "a cancelled wait leaves nothing behind"


async def test_a_wait_times_out_leaves_nothing_behind_and_keeps_its_deadline() -> None:
    changes = Changes()
    loop = asyncio.get_running_loop()
    started = loop.time()
    wait = asyncio.create_task(changes.wait("k", lambda: False, 0.2))
    for _ in range(3):  # woken for nothing: the deadline stays the first one
        await asyncio.sleep(0.03)
        changes.notify("k")
    assert await wait is False
    assert 0.2 <= loop.time() - started < 2.0
    assert changes.waiting("k") == 0
    assert await changes.wait("k", lambda: True, 0) is True  # holds already: no wait


# --- the stream response ------------------------------------------------------------------------


class Client:
    """An ASGI server's side of one stream: what was sent, and a disconnect on demand."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.gone = asyncio.Event()

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


SCOPE = {"type": "http", "asgi": {"spec_version": "2.3"}}


async def test_a_stream_ends_quietly_when_its_client_goes_and_closes_its_events() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            yield b": open\n\n"
            while True:
                await asyncio.sleep(3600)
        finally:
            closed.set()

    client = Client()
    response = asyncio.create_task(EventStream(endless())(SCOPE, client.receive, client.send))
    while not client.bodies():
        await asyncio.sleep(0.01)
    client.gone.set()
    await asyncio.wait_for(response, 5)  # returns: the client's going is no error
    assert client.bodies() == [b": open\n\n"]
    await asyncio.wait_for(closed.wait(), 5)
    assert client.sent[0]["status"] == 200


async def test_a_stream_still_ends_when_the_server_cancels_it() -> None:
    async def endless() -> AsyncIterator[bytes]:
        yield b": open\n\n"
        await asyncio.sleep(3600)

    client = Client()
    response = asyncio.create_task(EventStream(endless())(SCOPE, client.receive, client.send))
    while not client.bodies():
        await asyncio.sleep(0.01)
    response.cancel()  # the server stops: that cancellation is not taken back
    with pytest.raises(asyncio.CancelledError):
        await response


async def test_a_stream_that_ends_by_itself_ends_the_response() -> None:
    async def two() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"

    client = Client()
    await asyncio.wait_for(EventStream(two())(SCOPE, client.receive, client.send), 5)
    assert client.bodies() == [b"a", b"b", b""]


# --- the wire bytes ------------------------------------------------------------------------------


class Turn(BaseModel):
    seq: int
    text: str | None = None


async def test_event_bytes_match_fastapis_framing_for_models_dicts_raw_data_and_comments(
) -> None:
    async def events() -> AsyncIterator[ServerSentEvent]:
        yield ServerSentEvent(event="turn", id="3", data=Turn(seq=3, text="é"))
        yield ServerSentEvent(event="d", data={"a": "é", "b": [1, 2]})
        yield ServerSentEvent(event="r", id="4", raw_data='{"seq":4}')
        yield ServerSentEvent(comment="keep-alive")

    out = [wire(b) async for b in events()]
    assert out == [
        'event: turn\ndata: {"seq":3,"text":"é"}\nid: 3\n\n'.encode(),
        'event: d\ndata: {"a":"é","b":[1,2]}\n\n'.encode(),
        b'event: r\ndata: {"seq":4}\nid: 4\n\n',
        b": keep-alive\n\n"]


def test_a_models_json_is_its_model_dump_json() -> None:
    odd = 'é \u2028 \x7f \n\t "quoted" <b>&</b> \\ 😀'
    models: list[BaseModel] = [
        ParticipantMessageEvent(seq=2, message_id="m-1", text=odd, at="2026-12-07T23:00:00Z"),
        AgentMessageEvent(seq=3, turn="cnv-1:turn-2", text=odd),
        DeltaEvent(turn="cnv-1:turn-2", attempt=1, offset=0, text=odd),
        ProposalEvent(seq=4, turn="cnv-1:turn-2", proposal={"title": odd, "n": [1, 2.5, None]}),
        TurnEvent(seq=5, turn="cnv-1:turn-2", state="CouldNotInterpret", reason=odd,
                  reason_code="could_not_interpret"),
        TurnEvent(seq=6, turn="cnv-1:turn-3", state="Replied"),
    ]
    for model in models:
        assert model_json(model) == model.model_dump_json()


# --- one rendering per event, shared by the streams of a view -------------------------------------


def conversation(*states: str) -> ConversationViews:
    views = ConversationViews()
    views.apply(Envelope(record=ConversationStarted(conversation="cnv-1", owner="alice"),
                         key="cnv-1", source="/t", seq=1, tenant="default"))
    for seq, state in enumerate(states, start=2):
        views.apply(Envelope(record=TurnStateChanged(conversation="cnv-1", turn=f"cnv-1:t{seq}",
                                                     state=state),  # type: ignore[arg-type]
                             key="cnv-1", source="/t", seq=seq, tenant="default"))
    return views


def test_streams_of_one_view_render_each_event_once_and_keep_only_the_last_few() -> None:
    views = conversation(*["Replied"] * (RENDERED_KEPT + 2))
    view = views["cnv-1"]
    calls: list[int] = []

    def render(env: Envelope) -> Frame:
        calls.append(env.seq or 0)
        return sse_frame(ServerSentEvent(event="turn", id=str(env.seq), data={"s": env.seq}))

    events = list(view.events)
    for event in events:  # as each event arrives, fifty streams of the conversation send it
        out = [view.render_once(event, render) for _stream in range(50)]
        assert len({id(o) for o in out}) == 1, "the same bytes for every stream"
        assert out[0] == f'event: turn\ndata: {{"s":{event.seq}}}\nid: {event.seq}\n\n'.encode()
    assert calls == [e.seq for e in events], "each event rendered once"
    assert list(view.rendered) == [e.seq for e in events][-RENDERED_KEPT:]
    view.render_once(events[0], render)  # a stream far behind renders its own
    assert calls[-1] == events[0].seq and len(view.rendered) == RENDERED_KEPT


def test_a_rendering_that_ends_the_stream_is_not_kept_and_erasure_forgets_them() -> None:
    views = conversation("Replied", "CouldNotInterpret")
    view = views["cnv-1"]
    _started, first, second = view.events

    def refuse(env: Envelope) -> ServerSentEvent:
        raise StreamEnd("end; the conversation was erased")

    with pytest.raises(StreamEnd):
        view.render_once(second, refuse)
    assert view.render_once(first, lambda e: ServerSentEvent(id="2")).id == "2"
    assert list(view.rendered) == [first.seq]  # the refused one left nothing
    views.apply(Envelope(record=ConversationErased(conversation="cnv-1"), key="cnv-1",
                         source="/t", seq=4, tenant="default"))
    assert view.rendered == {}, "no opened content outlives the conversation's erasure"


async def test_frames_go_on_the_wire_as_they_are_beside_events() -> None:
    frame = sse_frame(ServerSentEvent(event="turn", id="5", data=Turn(seq=5)))

    async def events() -> AsyncIterator[ServerSentEvent | Frame]:
        yield frame
        yield ServerSentEvent(comment="keep-alive")

    out = [wire(b) async for b in events()]
    assert out == [b'event: turn\ndata: {"seq":5,"text":null}\nid: 5\n\n', b": keep-alive\n\n"]
    assert out[0] is frame, "written as rendered, not framed again"


def test_a_conversation_events_frame_is_the_bytes_its_sse_event_framed() -> None:
    """``render.event_frame`` (once per event, for every stream) writes what the stream wrote
    when each stream framed its own ``ServerSentEvent``: message, reply, proposal, turn (its
    reason sealed and plain), text with quotes, newlines, control characters and non-ASCII."""
    sealer = Sealer(MemoryKeyStore())
    c = "cnv-1"
    text = 'é "quoted" \\ line\nbreak\ttab \x01 \u2028 😀 </script>'
    records = [
        ConversationStarted(conversation=c, owner="alice"),
        MessageRecorded(conversation=c, message_id="m-1", text=sealer.seal(c, "m-1", text),
                        at="2026-12-01T10:00:00.123+00:00"),
        TurnRequested(conversation=c, turn=f"{c}:t1", message_seq=2),
        ReplyRecorded(conversation=c, turn=f"{c}:t1", reply_id="r-1",
                      text=sealer.seal(c, "r-1", text)),
        ProposalRecorded(conversation=c, turn=f"{c}:t1", proposal_id="p-1",
                         proposal=sealer.seal_json(c, "p-1", {"title": text, "n": [1, 2.5]})),
        TurnStateChanged(conversation=c, turn=f"{c}:t1", state="Replied"),
        TurnStateChanged(conversation=c, turn=f"{c}:t2", state="CouldNotInterpret",
                         reason_code="DEADLINE_EXCEEDED",
                         sealed_reason=sealer.seal(c, f"{c}:t2:reason", text)),
        TurnStateChanged(conversation=c, turn=f"{c}:t3", state="CouldNotInterpret",
                         reason=text),
    ]
    seen = 0
    for seq, rec in enumerate(records, start=1):
        env = Envelope(record=rec, key=c, source="/t", seq=seq, tenant="default")
        sse = render.sse_event(sealer, env)
        frame = render.event_frame(sealer, env)
        if sse is None:
            assert frame is None
            continue
        seen += 1
        assert frame == sse_frame(sse)
        assert frame.startswith(f"event: {sse.event}\ndata: ".encode())
        assert frame.endswith(f"\nid: {seq}\n\n".encode())
    assert seen == 6
