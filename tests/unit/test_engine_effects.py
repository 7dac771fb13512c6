"""KafkaEffectSink: each effect becomes its ``schemas.agent`` record on the right topic, keyed
by workflow, with the effect's idempotency key as record id; conversation content sealed."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from consumers.engine import (
    AgentSpec,
    DisplayChunk,
    DisplayEvent,
    KafkaEffectSink,
    ModelCallEffect,
    Ok,
    PersistMessage,
    TelemetryEffect,
    Tool,
    ToolCallEffect,
    ToolRegistry,
    TurnInput,
    effects_from_envelopes,
    run_turn,
)
from consumers.engine.effects import PERSIST_EVENT, SealingRequired
from consumers.engine.testing import ScriptedModel, text, tool_use
from schemas.agent import (
    DisplayEventRecorded,
    DisplayEventsRecorded,
    ModelCallRecorded,
    ModelCallWithDisplay,
    TelemetryEvent,
    ToolCallRecorded,
    agent_parts,
    display_events,
    telemetry_events,
)
from schemas.base import Sealed
from streams.envelope import Envelope, decode, encode
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings

SECRET = "my neighbour Jane Roe at 12 Elm Street"
WF = "wf-conversation-turn:cnv-42:3"


class FakeProducer:
    """Collects what would be produced (the ``RecordProducer.send`` signature)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Envelope]] = []

    async def send(self, topic: str, env: Envelope) -> None:
        self.sent.append((topic, env))


@pytest.fixture
def settings() -> VoiceSettings:  # shadows the Kafka-backed fixture: no broker needed here
    return VoiceSettings(topic_prefix="t-eng.")


def synthetic(conv: str | None) -> list:
    base = {"turn_id": "cnv-42:turn-3", "conversation_id": conv}
    event = DisplayEvent(id="k/d1", type="text_delta", channel="response", data={"text": SECRET},
                         ts=1700000000.5, message_id="cnv-42:turn-3", verb="append")
    return [
        ModelCallEffect(key="k/m1", agent_name="assistant", iteration=1,
                        request_model="claude-sonnet-4-5", response_model="claude-sonnet-4-5",
                        input_tokens=120, output_tokens=30, cache_read_input_tokens=100,
                        finish_reasons=["end_turn"], latency_ms=12.5, cost_usd=0.001,
                        response={"content": [{"type": "text", "text": SECRET}],
                                  "stop_reason": "end_turn"}, **base),
        ModelCallEffect(key="k/m2", agent_name="assistant", iteration=2,
                        request_model="sim-fail-429", error_type="RateLimitError", **base),
        ToolCallEffect(key="k/t1", agent_name="assistant", tool_call_id="toolu_1",
                       tool_name="search_issues", envelope="hint", hint_kind="unknown_id",
                       duration_ms=3.5, arguments={"query": SECRET},
                       result={"envelope": {"kind": "hint"}, "text": SECRET}, **base),
        DisplayChunk(key="k/d1", event=event, **base),
        PersistMessage(key="k/persist", content=SECRET,
                       structured_content=[{"role": "assistant", "content": SECRET}],
                       cost_usd=0.002, **base),
        TelemetryEffect(key="k/x1", name="contract_envelope",
                        attributes={"tool": "search_issues", "envelope": "hint"}, **base),
    ]


async def test_each_effect_becomes_its_record_on_its_topic(settings):
    producer = FakeProducer()
    sink = KafkaEffectSink(producer, settings, WF, tenant="acme", causation="rec-1")
    effects = synthetic(None)
    for e in effects:
        await sink.emit(e)
    await sink.drain()  # emit hands over; drain is when the records are on the broker
    topics = [t for t, _ in producer.sent]
    assert topics == ["t-eng.voice.agent"] * 4 + ["t-eng.voice.telemetry"]
    envs = [env for _, env in producer.sent]
    # redelivery dedupes by id; the two display events in a row are one record, the first's id
    assert [env.id for env in envs] == ["k/m1", "k/m2", "k/t1", "k/d1", "k/x1"]
    assert {(env.key, env.correlation, env.causation, env.tenant, env.subject)
            for env in envs} == {(WF, WF, "rec-1", "acme", "cnv-42:turn-3")}
    m1, m2, tool, batch, tel = (env.record for env in envs)
    assert isinstance(batch, DisplayEventsRecorded) and batch.workflow == WF
    disp, persist = batch.events
    assert isinstance(m1, ModelCallRecorded) and m1.call_id == "k/m1" and m1.workflow == WF
    assert (m1.input_tokens, m1.cache_read_input_tokens, m1.cost_usd) == (120, 100, 0.001)
    assert m1.response == effects[0].response  # plaintext: no conversation
    assert (m2.error_type, m2.response) == ("RateLimitError", None)
    assert isinstance(tool, ToolCallRecorded) and tool.envelope == "hint"
    assert (tool.hint_kind, tool.duration_ms, tool.arguments) == ("unknown_id", 3.5,
                                                                  {"query": SECRET})
    assert isinstance(disp, DisplayEventRecorded) and disp.event_id == "k/d1"
    assert (disp.type, disp.channel, disp.verb, disp.metadata["ts"]) == (
        "text_delta", "response", "append", 1700000000.5)
    assert isinstance(persist, DisplayEventRecorded) and persist.type == PERSIST_EVENT
    assert persist.metadata == {"cost_usd": 0.002, "end_reason": "end_turn"}
    assert isinstance(tel, TelemetryEvent) and tel.name == "contract_envelope"
    assert tel.attributes["envelope"] == "hint" and tel.workflow == WF
    for env in envs:  # every envelope survives the wire format
        assert decode(*encode(env)).record == env.record


async def test_conversation_content_is_sealed_and_opens_back(settings):
    sealer = Sealer(MemoryKeyStore())
    producer = FakeProducer()
    sink = KafkaEffectSink(producer, settings, WF, sealer)
    effects = synthetic("cnv-42")
    for e in effects:
        await sink.emit(e)
    await sink.drain()  # emit hands over; drain is when the records are on the broker
    for _, env in producer.sent:
        key, value, headers = encode(env)
        wire = value + b"".join(v for _, v in headers) + key
        assert SECRET.encode() not in wire, env.record
        assert b"Jane" not in wire
    m1, _, tool, batch, _ = (env.record for _, env in producer.sent)
    disp, persist = batch.events
    assert isinstance(m1.response, Sealed) and isinstance(tool.arguments, Sealed)
    assert isinstance(tool.result, Sealed) and isinstance(disp.data, Sealed)
    assert isinstance(persist.data, Sealed)
    assert sealer.open_json("cnv-42", "k/m1/response", m1.response) == effects[0].response
    assert sealer.open_json("cnv-42", "k/t1/arguments", tool.arguments) == {"query": SECRET}
    assert sealer.open_json("cnv-42", "k/d1/data", disp.data) == {"text": SECRET}
    assert sealer.open_json("cnv-42", "k/persist/data", persist.data)["content"] == SECRET
    # records decode back into the effects replay needs
    decoded = [decode(*encode(env)) for _, env in producer.sent]
    back = effects_from_envelopes(decoded, sealer)
    assert [b.key for b in back] == ["k/m1", "k/m2", "k/t1"]
    assert back[0].response == effects[0].response and back[0].turn_id == "cnv-42:turn-3"
    assert back[2].arguments == {"query": SECRET} and back[2].result == effects[2].result


async def test_conversation_content_without_a_sealer_is_refused(settings):
    producer = FakeProducer()
    sink = KafkaEffectSink(producer, settings, WF, sealer=None)
    with pytest.raises(SealingRequired):
        await sink.emit(synthetic("cnv-42")[0])
    await sink.emit(synthetic("cnv-42")[-1])  # telemetry carries no content: fine
    await sink.drain()
    assert len(producer.sent) == 1


async def test_a_whole_turn_through_the_kafka_sink_leaks_no_plaintext(settings):
    class Q(BaseModel):
        query: str

    def search(args: Q, ctx):
        return Ok(rows=[{"id": "iss-1", "title": f"About {args.query}"}])

    spec = AgentSpec("concern-extraction", "You extract concerns.",
                     ToolRegistry([Tool("search_issues", "Search", Q, search)]),
                     "claude-sonnet-4-5")
    model = ScriptedModel([[text("Let me search."), tool_use("search_issues", {"query": SECRET})],
                           [text(f"I heard you about {SECRET}.")]])
    sealer = Sealer(MemoryKeyStore())
    producer = FakeProducer()
    result = await run_turn(spec, TurnInput("cnv-42:turn-3", f"Worried about {SECRET}",
                                            conversation_id="cnv-42"),
                            model, KafkaEffectSink(producer, settings, WF, sealer))
    assert result.end_reason == "end_turn"
    assert len({env.id for _, env in producer.sent}) == len(producer.sent)
    for _, env in producer.sent:
        key, value, headers = encode(env)
        assert b"Elm Street" not in value + b"".join(v for _, v in headers), env.record
    # Two model calls, one tool call, the turn's telemetry: four records. The display events
    # travel on the model calls' records, before and after each call, in emit order.
    kinds = [type(env.record).__name__ for _, env in producer.sent]
    assert kinds == ["ModelCallWithDisplay", "ToolCallRecorded", "ModelCallWithDisplay",
                     "TelemetryEvents"]
    shown = [e.type for _, env in producer.sent for e in display_events(env.record)]
    assert shown == ["busy", "text_delta", "reasoning", "tool_call", "tool_result",
                     "text_delta", "text_complete", "message_persisted", "cost", "idle", "done"]
    parts = [type(p).__name__ if not isinstance(p, DisplayEventRecorded) else p.type
             for _, env in producer.sent for p in agent_parts(env.record)]
    assert parts == ["busy", "text_delta", "reasoning", "ModelCallRecorded", "tool_call",
                     "ToolCallRecorded", "tool_result", "ModelCallRecorded", "text_delta",
                     "text_complete", "message_persisted", "cost", "idle", "done",
                     "TelemetryEvents"], "the order the engine emitted them in"
    # Each call's record keeps its own time and content; a re-run reads the calls as before.
    recorded = effects_from_envelopes([env for _, env in producer.sent], sealer)
    assert [type(e).__name__ for e in recorded] == ["ModelCallEffect", "ToolCallEffect",
                                                    "ModelCallEffect"]
    times = [env.time for _, env in producer.sent]
    assert times[0] <= times[1] <= times[2], "a held call's record keeps the time it was made"
    facts = [t for _, env in producer.sent for t in telemetry_events(env.record)]
    assert [t.name for t in facts] == ["user_message_labels", "tool_decision",
                                       "contract_envelope", "turn_completed"]
    assert all(isinstance(t.attributes["ts"], float) for t in facts)
    json.dumps([env.record.model_dump(mode="json") for _, env in producer.sent],
               allow_nan=False)


async def test_a_batch_is_bounded_in_events_and_bytes(settings):
    """Display events in a row start a new batch past ``BATCH_EVENTS`` or ``BATCH_BYTES``, so
    no batch is larger than its topic takes; each event keeps its own id and content id."""
    from consumers.engine.effects import BATCH_BYTES, BATCH_EVENTS

    sealer = Sealer(MemoryKeyStore())
    producer = FakeProducer()
    sink = KafkaEffectSink(producer, settings, WF, sealer)
    base = {"turn_id": "cnv-42:turn-3", "conversation_id": "cnv-42"}
    n = BATCH_EVENTS + 1
    for i in range(n):
        event = DisplayEvent(id=f"k/d{i}", type="progress", channel="status", ts=1.0,
                             data={"text": f"step {i}"})
        await sink.emit(DisplayChunk(key=f"k/d{i}", event=event, **base))
    big = "x" * (BATCH_BYTES // 2 + 1)
    for i in (n, n + 1):
        event = DisplayEvent(id=f"k/d{i}", type="text_delta", channel="response", ts=1.0,
                             data={"text": big})
        await sink.emit(DisplayChunk(key=f"k/d{i}", event=event, **base))
    await sink.drain()
    sizes = [len(display_events(env.record)) for _, env in producer.sent]
    assert sizes == [BATCH_EVENTS, 2, 1]
    assert [env.id for _, env in producer.sent] == ["k/d0", f"k/d{BATCH_EVENTS}", f"k/d{n + 1}"]
    events = [e for _, env in producer.sent for e in display_events(env.record)]
    assert [e.event_id for e in events] == [f"k/d{i}" for i in range(n + 2)]
    assert sealer.open_json("cnv-42", f"k/d{n}/data", events[n].data) == {"text": big}
    for _, env in producer.sent:
        assert len(encode(env)[1]) < BATCH_BYTES + 64 * 1024


async def test_a_model_calls_record_carries_display_events_within_the_batch_bounds(settings):
    """A model call's record takes the events around it up to ``BATCH_EVENTS`` in all; the
    rest go out in a batch after it, every event once, in order."""
    from consumers.engine.effects import BATCH_EVENTS

    producer = FakeProducer()
    sink = KafkaEffectSink(producer, settings, WF)
    base = {"turn_id": "cnv-42:turn-3", "conversation_id": None}

    async def show(i: int) -> None:
        event = DisplayEvent(id=f"k/d{i}", type="progress", channel="status", ts=1.0,
                             data={"text": f"step {i}"})
        await sink.emit(DisplayChunk(key=f"k/d{i}", event=event, **base))

    for i in range(3):
        await show(i)
    await sink.emit(ModelCallEffect(key="k/m1", agent_name="a", iteration=1,
                                    request_model="m", **base))
    for i in range(3, BATCH_EVENTS + 5):
        await show(i)
    await sink.drain()
    records = [env.record for _, env in producer.sent]
    assert [type(r).__name__ for r in records] == ["ModelCallWithDisplay",
                                                   "DisplayEventsRecorded"]
    call = records[0]
    assert isinstance(call, ModelCallWithDisplay)
    assert (len(call.display_before), len(call.display_before) + len(call.display_after)) \
        == (3, BATCH_EVENTS)
    events = [e.event_id for r in records for e in display_events(r)]
    assert events == [f"k/d{i}" for i in range(BATCH_EVENTS + 5)]
    assert [env.id for _, env in producer.sent] == ["k/m1", f"k/d{BATCH_EVENTS}"]


async def test_voice_replay_prints_a_turn_of_the_new_shapes_as_the_records_they_stand_for(
        settings, monkeypatch):
    """``voice replay``'s printout of a workflow: a model call carrying display events prints
    the events before it, the call (as ``model_call.v1``), the events after it, one line each,
    their content opened under each event's own content id."""
    import deploy.replay as replay

    model = ScriptedModel([[text("Let me search."), tool_use("search_issues", {"query": "q"})],
                           [text(f"About {SECRET}.")]])
    spec = AgentSpec("concern-extraction", "x", ToolRegistry(
        [Tool("search_issues", "Search", _Query, lambda a, c: Ok(rows=[]))]), "claude-sonnet-4-5")
    sealer = Sealer(MemoryKeyStore())
    producer = FakeProducer()
    await run_turn(spec, TurnInput("cnv-42:turn-3", "hi", conversation_id="cnv-42"), model,
                   KafkaEffectSink(producer, settings, "cnv-42:turn-3", sealer))
    agent = [env for topic, env in producer.sent if topic.endswith("voice.agent")]
    monkeypatch.setattr(replay, "records",
                        lambda _s, spec, key: agent if spec.name == "voice.agent" else [])
    lines = list(replay.replay_workflow(settings, "cnv-42:turn-3", sealer))
    types = [line.split(" ")[2] for line in lines]
    assert types == ["voice.agent.display_event.v1"] * 3 + ["voice.agent.model_call.v1"] + [
        "voice.agent.display_event.v1", "voice.agent.tool_call.v1",
        "voice.agent.display_event.v1", "voice.agent.model_call.v1"] + [
        "voice.agent.display_event.v1"] * 6
    assert any(SECRET in line for line in lines if "display_event.v1" in line), \
        "the reply's text opened under its event's own content id"


class _Query(BaseModel):
    query: str
