"""The worked example of ``docs/architecture.md``: a fourth aggregate (private notes) is its
records, its ``decide`` and its views — plugged into the real frame with nothing of the frame
changed. The worker side runs on the real ``WorkerContext`` and ``Writer``; the edge side on the
real projection base and SSE loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi.sse import ServerSentEvent

from api.frame.projection import KeptEvents, StreamProjection
from api.frame.sse import Feed, sse_stream
from consumers.frame import Ack, Aggregate, AggregateState, Decision, append
from consumers.frame.context import WorkerContext
from schemas.base import Record, record_type
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope, decode, encode
from streams.settings import VoiceSettings
from streams.topics import TopicSpec
from tests.unit.test_writer import FakePublisher

CNV = "cnv-00112233aabbccdd"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
MAX_NOTES = 3

# 1. Records.


@record_type("voice.example.add_note.v1")
class AddNote(Record):
    conversation: str
    text: str


@record_type("voice.example.note_added.v1")
class NoteAdded(Record):
    conversation: str
    text: str
    at: str


# 2. A topic (a real one would be added to ``streams.topics.TOPICS``).
NOTES = TopicSpec("voice.example.notes", "Each conversation's notes; key = conversation id.")


# 3. The aggregate: state and decide, nothing else.


@dataclass(kw_only=True)
class NotesState(AggregateState):
    count: int = 0
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)


class Notes(Aggregate[NotesState]):
    name = "notes"
    state = NotesState
    log = NOTES
    source = "/voice/notes"
    commands = (AddNote,)

    def decide(self, state: NotesState | None, cmd: Envelope) -> Decision[NotesState]:
        state = state or NotesState()
        rec = cmd.record
        assert isinstance(rec, AddNote)
        if state.count >= MAX_NOTES:
            return Decision(state, ack=Ack.rejected(f"at most {MAX_NOTES} notes"))
        state.count += 1
        records = append(state, NoteAdded(conversation=cmd.key, text=rec.text,
                                          at=cmd.time.isoformat()))
        return Decision(state, records, Ack.accepted(state.seq))


# 4. The worker product.


class NotesProduct:
    name = "notes"

    def register(self, ctx: WorkerContext) -> None:
        ctx.aggregate(Notes())


# 5. The edge: a view on the projection base.


@dataclass(kw_only=True)
class NotesView(KeptEvents[Envelope]):
    conversation: str

    @property
    def stream_name(self) -> str:
        return f"notes of {self.conversation}"

    @staticmethod
    def cursor_of(event: Envelope) -> int:
        assert event.seq is not None
        return event.seq


class NotesViews(StreamProjection[NotesView]):
    def apply(self, env: Envelope) -> None:
        view = self.by_key.setdefault(env.key, NotesView(conversation=env.key, kept=self.kept))
        if view.accept(env):
            view.keep(env)
            self.notify(env.key)


def add(id_: str, text: str) -> Envelope:
    return Envelope(record=AddNote(conversation=CNV, text=text), key=CNV, source="/voice/edge",
                    subject=CNV, tenant="t1", id=id_, time=T0)


def test_a_fourth_aggregate_runs_on_the_unchanged_frame(make_worker: Any) -> None:
    settings = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", topic_prefix="t.")
    worker = make_worker(settings)
    NotesProduct().register(worker)  # what one more entry in ``products()`` does
    agg, table = worker.writer._owners[AddNote]
    assert isinstance(agg, Notes) and "notes" in worker.app.tables

    # The worker's own writer, its publisher replaced by a journal (no broker in a unit test).
    journal: list[tuple[str, ...]] = []
    out = FakePublisher(journal)
    worker.writer.publisher = out  # type: ignore[assignment]
    state: dict[str, Any] = {}
    worker.writer._owners[AddNote] = (agg, state)

    async def run() -> None:
        for i, text in enumerate(["buy milk", "call the council", "again", "one too many"]):
            await worker.writer.dispatch(add(f"cmd-{i}", text))
        await worker.writer.dispatch(add("cmd-1", "call the council"))  # redelivered

    asyncio.run(run())
    notes = [env for topic, env in out.sent if topic == NOTES.name]
    acks = [env.record for topic, env in out.sent if topic != NOTES.name]
    assert [(n.seq, n.id, n.tenant, n.causation) for n in notes] == [
        (1, "cmd-0-1", "t1", "cmd-0"), (2, "cmd-1-2", "t1", "cmd-1"), (3, "cmd-2-3", "t1", "cmd-2")]
    assert all(isinstance(a, CommandAcknowledged) for a in acks)
    assert [(a.outcome, a.seq) for a in acks] == [  # type: ignore[attr-defined]
        ("accepted", 1), ("accepted", 2), ("accepted", 3), ("rejected", None), ("duplicate", 2)]
    assert state[CNV]["count"] == 3

    # The edge: the projection dedupes a redelivered record; the one SSE loop streams them.
    views = NotesViews()

    async def stream() -> list[ServerSentEvent]:
        for env in [*notes, notes[1]]:
            views.apply(env)

        def render(env: Envelope) -> ServerSentEvent:
            return ServerSentEvent(event="note", id=str(env.seq), data={"text": env.record.text})

        feed = Feed(view=lambda: views.get(CNV), render=render,
                    wait=lambda until, t: views.wait(CNV, lambda _v: until(), t))
        return [sse async for sse in sse_stream(feed, 1, bound_s=0.3)]

    sent = asyncio.run(stream())
    assert [(s.id, s.data) for s in sent if s.id] == [("2", {"text": "call the council"}),
                                                     ("3", {"text": "again"})]
    assert sent[-1].comment == "end; reconnect with after=3"


def test_the_example_records_travel_through_the_one_codec() -> None:
    env = Envelope(record=NoteAdded(conversation=CNV, text="buy milk", at="t"), key=CNV,
                   source="/voice/notes", seq=4, tenant="t1", id="cmd-9-4", time=T0)
    back = decode(*encode(env))
    assert back.type == "voice.example.note_added.v1" and back.record == env.record
    assert (back.seq, back.tenant, back.id) == (4, "t1", "cmd-9-4")
