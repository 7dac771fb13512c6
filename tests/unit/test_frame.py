"""The edge's frame: the projection base (dedupe, kept events, cursors) and the one SSE loop
(resume, ids, skipped events, keep-alives, the bound, and the ways a stream ends)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest
from fastapi.exceptions import RequestValidationError
from fastapi.sse import ServerSentEvent

from api.frame.projection import CursorTooOld, KeptEvents, StreamProjection
from api.frame.sse import Feed, StreamEnd, resume_cursor, served_cursor, sse_stream
from schemas.conversation import ConversationErased
from streams.envelope import Envelope


@dataclass(kw_only=True)
class Numbers(KeptEvents[int]):
    """A stream whose events are their own cursor (gaps allowed)."""

    name: str = "numbers"

    @property
    def stream_name(self) -> str:
        return self.name

    @staticmethod
    def cursor_of(event: int) -> int:
        return event


def numbers(*events: int, kept: int = 100, head: int | None = None) -> Numbers:
    view = Numbers(kept=kept)
    for e in events:
        view.keep(e)
    view.last_seq = head if head is not None else (events[-1] if events else 0)
    return view


def env(seq: int | None) -> Envelope:
    return Envelope(record=ConversationErased(conversation="c"), key="c", source="/t", seq=seq)


def test_accept_dedupes_by_seq() -> None:
    view = numbers()
    assert view.accept(env(1)) and view.accept(env(3))
    assert not view.accept(env(3)) and not view.accept(env(2)) and not view.accept(env(None))
    assert view.last_seq == 3


def test_events_after_with_gaps_and_the_oldest_cursor() -> None:
    view = numbers(2, 3, 7, 9, kept=3)
    assert list(view.events) == [3, 7, 9] and view.oldest_cursor() == 2
    assert view.events_after(2) == [3, 7, 9]
    assert view.events_after(5) == [7, 9] and view.events_after(9) == []
    with pytest.raises(CursorTooOld) as err:
        view.events_after(1)
    assert err.value.oldest == 2 and "numbers" in str(err.value)
    assert numbers(head=4).oldest_cursor() == 4  # nothing kept: only "from now" is served


def test_events_after_each_cursor_it_serves_is_every_kept_event_past_it() -> None:
    # A caught-up stream's cursor (the next-to-last event) takes a shortcut: the same answer.
    for kept in (1, 2, 3, 10):
        view = numbers(2, 3, 7, 9, 12, kept=kept)
        for cursor in range(view.oldest_cursor(), 14):
            assert view.events_after(cursor) == [e for e in view.events if e > cursor], (
                kept, cursor)


def test_served_cursor_and_resume_rules() -> None:
    view = numbers(5, 6)
    assert served_cursor(view, 4) == 4
    with pytest.raises(CursorTooOld):
        served_cursor(view, 3)
    assert resume_cursor(3, "7") == 3  # the query wins
    assert resume_cursor(None, "7") == 7 and resume_cursor(None, " ") == 0
    assert resume_cursor(None, None) == 0
    for bad in ("x", "-1"):
        with pytest.raises(RequestValidationError) as err:
            resume_cursor(None, bad)
        assert err.value.errors()[0]["loc"] == ("header", "Last-Event-ID")


def test_a_stream_projection_keeps_at_least_one() -> None:
    with pytest.raises(ValueError):
        StreamProjection(kept=0)


class Streams(StreamProjection[Numbers]):
    def add(self, key: str, *events: int) -> None:
        view = self.by_key.setdefault(key, Numbers(kept=self.kept))
        for e in events:
            view.keep(e)
            view.last_seq = e
        self.notify(key)


def feed_of(streams: Streams, key: str = "k", **kw: object) -> Feed[int]:
    def render(e: int) -> ServerSentEvent | None:
        if e == 13:
            raise StreamEnd("end; unlucky")
        return None if e % 2 == 0 else ServerSentEvent(event="n", id=str(e), data={"n": e})

    return Feed(view=lambda: streams.get(key), render=render,
                wait=lambda until, t: streams.wait(key, lambda _v: until(), t), **kw)


async def collect(stream: object, limit: float = 5.0) -> list[ServerSentEvent]:
    async def run() -> list[ServerSentEvent]:
        return [sse async for sse in stream]  # type: ignore[attr-defined]
    return await asyncio.wait_for(run(), limit)


async def test_resumes_skips_unseen_events_and_ends_before_the_bound() -> None:
    streams = Streams()
    streams.add("k", 1, 2, 3, 4, 5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    out = await collect(sse_stream(feed_of(streams), 1, bound_s=0.6))
    assert loop.time() - started < 0.6
    ids = [s.id for s in out if s.id is not None]
    assert ids == ["3", "5"]  # after 1; the even ones are not shown, their ids skipped
    assert "keep-alive" in [s.comment for s in out]
    assert out[-1].comment == "end; reconnect with after=5"


async def test_live_events_arrive_and_the_resume_point_passes_what_was_skipped() -> None:
    streams = Streams()
    streams.add("k", 1)

    async def later() -> None:
        await asyncio.sleep(0.05)
        streams.add("k", 2, 3)
        await asyncio.sleep(0.05)
        streams.add("k", 4)

    task = asyncio.create_task(later())
    out = await collect(sse_stream(feed_of(streams), 0, bound_s=0.9))
    await task
    assert [s.id for s in out if s.id] == ["1", "3"]
    assert out[-1].comment == "end; reconnect with after=4"


@pytest.mark.parametrize("events, kw, final", [
    ((1, 13, 15), {}, "end; unlucky"),
    ((1, 3), {"ends_after": lambda e, c: f"end; done at {c}" if e == 3 else None},
     "end; done at 3"),
    ((1, 3), {"idle": lambda: True}, "end; idle; resume with after=3"),
])
async def test_a_stream_ends_early(events: tuple[int, ...], kw: dict, final: str) -> None:
    streams = Streams()
    streams.add("k", *events)
    out = await collect(sse_stream(feed_of(streams, **kw), 0, bound_s=30))
    assert out[-1].comment == final and len([s for s in out if s.comment]) == 1


async def test_a_stream_ends_when_its_view_is_gone_or_the_cursor_too_old() -> None:
    streams = Streams(kept=2)
    out = await collect(sse_stream(feed_of(streams, gone="end; gone"), 0, bound_s=30))
    assert [s.comment for s in out] == ["end; gone"]
    streams.add("k", 1, 3, 5)
    out = await collect(sse_stream(feed_of(streams), 0, bound_s=30))
    assert [s.comment for s in out] == [
        "end; cursor 0 is too old, the oldest this edge serves is 2"]


async def test_an_event_that_arrives_while_one_is_being_sent_is_not_skipped() -> None:
    # Regression: the loop moved its cursor to the view's head *after* yielding, so an event
    # applied while the client was reading the previous one was passed over, never sent.
    streams = Streams()
    streams.add("k", 1)
    stream = sse_stream(feed_of(streams), 0, bound_s=0.6)
    first = await stream.__anext__()
    assert first.id == "1"
    streams.add("k", 3)  # the tail applies a record while the generator is suspended
    rest = await collect(stream)
    assert [s.id for s in rest if s.id] == ["3"]
    assert rest[-1].comment == "end; reconnect with after=3"


async def test_transient_events_dropped_before_a_stream_sends_them_do_not_make_it_spin() -> None:
    # Regression: a turn's reply deltas dropped once its reply was recorded left the view's
    # ``live_head`` above anything the stream could send; the stream's wait then returned at
    # once, for ever, and the busy loop starved the edge's event loop (every other request
    # waited for the next keep-alive).
    streams = Streams()
    streams.add("k", 1)
    view = streams.get("k")
    view.add_live("delta a")
    view.add_live("delta b")
    view.drop_live(lambda item: True)  # the turn completed: both dropped
    waits = 0

    async def wait(until: object, timeout: float) -> bool:
        nonlocal waits
        waits += 1
        return await streams.wait("k", lambda _v: until(), timeout)  # type: ignore[operator]

    sent: list[object] = []
    feed = Feed(view=lambda: streams.get("k"), render=lambda e: ServerSentEvent(id=str(e)),
                render_live=lambda item: sent.append(item) or ServerSentEvent(data=item),
                wait=wait)
    other = 0

    async def elsewhere() -> None:  # another request on the same event loop
        nonlocal other
        while True:
            other += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(elsewhere())
    out = await collect(sse_stream(feed, 0, bound_s=0.9))
    task.cancel()
    assert sent == [] and [s.id for s in out if s.id] == ["1"]
    assert waits < 10, waits  # it waited, rather than looping
    assert other > 20, other  # and the loop stayed free for others
    view.add_live("delta c")  # a new one is still sent
    assert [s.data for s in await collect(sse_stream(feed, 1, bound_s=0.6))
            if s.data] == ["delta c"]


async def test_a_cursor_older_than_kept_is_served_from_older_then_the_kept_ones() -> None:
    streams = Streams(kept=2)
    streams.add("k", 1, 3, 5, 7)  # keeps 5, 7: the oldest cursor it serves is 4
    asked: list[tuple[int, int]] = []

    async def older(after: int, upto: int) -> list[tuple[int, ServerSentEvent | None]]:
        asked.append((after, upto))
        return [(c, ServerSentEvent(event="n", id=str(c)) if c % 2 else None)
                for c in range(after + 1, upto + 1)]

    out = await collect(sse_stream(feed_of(streams, older=older), 0, bound_s=0.6))
    assert asked == [(0, 4)]
    assert [s.id for s in out if s.id] == ["1", "3", "5", "7"]  # each once, in order
    assert out[-1].comment == "end; reconnect with after=7"


async def test_older_events_that_cannot_be_read_end_the_stream_with_the_reason() -> None:
    streams = Streams(kept=2)
    streams.add("k", 1, 3, 5)

    async def older(after: int, upto: int) -> list[tuple[int, ServerSentEvent | None]]:
        raise StreamEnd(f"end; cursor {after} is too old to serve: gone from the log")

    out = await collect(sse_stream(feed_of(streams, older=older), 0, bound_s=30))
    assert [s.comment for s in out] == ["end; cursor 0 is too old to serve: gone from the log"]


async def test_an_older_read_longer_than_the_bound_ends_with_where_to_resume() -> None:
    streams = Streams(kept=2)
    streams.add("k", 1, 3, 5)

    async def older(after: int, upto: int) -> list[tuple[int, ServerSentEvent | None]]:
        await asyncio.sleep(10)
        return []

    loop = asyncio.get_running_loop()
    started = loop.time()
    out = await collect(sse_stream(feed_of(streams, older=older), 0, bound_s=0.6))
    assert loop.time() - started < 1.0
    assert [s.comment for s in out] == ["end; reconnect with after=0"]

def test_a_states_dict_is_a_deep_copy_both_ways_as_asdict_made_it() -> None:
    """``plain_copy`` (the table value's copy) gives what ``copy.deepcopy(asdict(...))`` gave:
    equal values, no structure shared with the state or the table's dict."""
    import copy
    from dataclasses import asdict, dataclass, field

    from consumers.frame.aggregate import AggregateState, plain_copy

    @dataclass
    class Inner:
        n: int = 1
        tags: list[str] = field(default_factory=lambda: ["a"])

    @dataclass(kw_only=True)
    class State(AggregateState):
        commands: dict[str, dict[str, object]] = field(default_factory=dict)
        pair: tuple[int, ...] = (1, 2)
        inner: Inner = field(default_factory=Inner)

    state = State(seq=3, tenant="t1", commands={"c1": {"seq": 1, "detail": {"turn": "x"}}})
    d = state.to_dict()
    assert d == copy.deepcopy(asdict(state))
    d["commands"]["c1"]["detail"]["turn"] = "changed"
    d["inner"]["tags"].append("b")
    assert state.commands["c1"]["detail"]["turn"] == "x" and state.inner.tags == ["a"]
    inner = Inner()
    raw = {"seq": 1, "tenant": None, "commands": {"c": {"seq": 1}}, "pair": (1, 2),
           "inner": inner}
    back = State.from_dict(raw)
    back.commands["c"]["seq"] = 9
    assert raw["commands"]["c"]["seq"] == 1 and back.pair == (1, 2)
    assert back.inner == inner and back.inner is not inner  # copied as deepcopy did
    odd = {1.5, 2.5}  # not a table value's type: still copied deeply
    assert plain_copy(odd) == odd and plain_copy(odd) is not odd


def test_a_workflow_state_is_copied_deeply_as_its_changelog_gives_it_back() -> None:
    """``json_copy`` (a workflow state's table value, both ways): no structure shared, and
    the value the changelog's JSON gives back after a recovery; what orjson refuses is
    copied by ``plain_copy``."""
    from consumers.frame.aggregate import json_copy
    from consumers.workflows.engine import WorkflowState

    state = WorkflowState(workflow="w", kind="turn", input={
        "history": {"partition": 3, "entries": [[1, 10], [2, 11]], "summary": None}},
        outputs={"reply": {"seqs": [4, 5], "usage": {"input": 1.5}}}, tenant="t1")
    d = state.to_dict()
    assert d == json.loads(json.dumps(d))
    d["input"]["history"]["entries"].append([3, 12])
    d["outputs"]["reply"]["seqs"][0] = 99
    assert state.input["history"]["entries"] == [[1, 10], [2, 11]]
    assert state.outputs["reply"]["seqs"] == [4, 5]
    back = WorkflowState.from_dict(d)
    assert back == WorkflowState.from_dict(json.loads(json.dumps(d)))  # as recovered
    back.input["history"]["entries"].clear()
    assert len(d["input"]["history"]["entries"]) == 3
    copy = state.copied()
    copy.outputs["reply"]["usage"]["input"] = 0
    assert state.outputs["reply"]["usage"]["input"] == 1.5 and copy.workflow == "w"
    assert json_copy({"pair": (1, 2)}) == {"pair": [1, 2]}  # as the changelog gives it back
    for refused in ({1: "a key that is not a string"}, {"n": 2 ** 70}):
        out = json_copy(refused)
        assert out == refused and out is not refused
