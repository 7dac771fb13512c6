"""The one port side effects pass through, and its adapters.

``EffectSink.emit`` is the only way a turn touches the outside world (besides the model call).
``RecordingSink`` keeps effects in memory (tests, replay). ``KafkaEffectSink`` turns each effect
into its record from ``schemas.agent`` and produces it: key = workflow id, record id = the
effect's idempotency key (so a redelivered effect is deduplicated downstream), correlation =
workflow id.

Display events travel on the model calls' records (``ModelCallWithDisplay``): those emitted
since the previous model call's record are the next one's ``display_before``; a model call's
record is held back (its time and trace kept) for the events after it, its ``display_after``,
until the turn's next agent record or its end. A tool call's record is never held back (a
re-run reads it to learn the tool ran), so events waiting for the next model call follow it
on the log, as they did; events that fit no record's bounds go out as one
``DisplayEventsRecorded``. A turn's telemetry facts go out as one ``TelemetryEvents`` when it
drains. A turn is a handful of records, not one per event (``docs/benchmarks.md``, "Records
per turn"); the first's id is each batch's.

When the turn belongs to a conversation, every piece of content (model responses, tool
arguments and results, display data, the persisted reply) is sealed with the conversation's
key first: nothing of a conversation travels in plaintext. The sink never swallows a produce
failure: the step fails and is retried with the same keys.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from consumers.engine.types import (
    DisplayChunk,
    DisplayEvent,
    Effect,
    ModelCallEffect,
    PersistMessage,
    TelemetryEffect,
    ToolCallEffect,
)
from schemas.agent import (
    DisplayEventRecorded,
    DisplayEventsRecorded,
    ModelCallRecorded,
    ModelCallWithDisplay,
    TelemetryEvent,
    TelemetryEvents,
    ToolCallRecorded,
)
from schemas.base import Record, Sealed
from streams.envelope import Envelope
from streams.settings import VoiceSettings
from streams.topics import AGENT, TELEMETRY, topic_name

SOURCE = "/voice/engine"
PERSIST_EVENT = "message_persisted"
"""``DisplayEventRecorded.type`` a ``PersistMessage`` becomes (no dedicated record type yet)."""

E = TypeVar("E")

BATCH_EVENTS = 64
"""At most this many events in one batch record (more in a row start the next)."""
BATCH_BYTES = 256 * 1024
"""About this many payload bytes in one batch record at most (well under any topic's
``max.message.bytes`` and ``VOICE_MAX_RECORD_BYTES``); an event alone may be larger, as
before batching."""


class EffectSink(Protocol):
    """Where a turn's effects go: ``emit`` hands one over (in order); ``drain`` returns once
    every effect emitted so far is durable. ``run_turn`` drains before it returns."""

    async def emit(self, effect: Effect) -> None: ...

    async def drain(self) -> None: ...


class RecordingSink:
    """Keeps every effect in order; for tests and replay."""

    def __init__(self) -> None:
        self.effects: list[Effect] = []

    async def emit(self, effect: Effect) -> None:
        self.effects.append(effect)

    async def drain(self) -> None:
        return None

    def of(self, cls: type[E]) -> list[E]:
        """The effects of one type, in order."""
        return [e for e in self.effects if isinstance(e, cls)]

    def display(self, *types: str) -> list[DisplayEvent]:
        """Display events (optionally of the given types), in order."""
        return [e.event for e in self.of(DisplayChunk) if not types or e.event.type in types]


class RecordSender(Protocol):
    async def send(self, topic: str, env: Envelope) -> Any: ...


class ContentSealer(Protocol):
    def seal_json(self, conversation: str, content_id: str, payload: dict[str, Any]) -> Sealed: ...

    def open_json(self, conversation: str, content_id: str, sealed: Sealed) -> dict[str, Any]: ...


class SealingRequired(Exception):
    """A conversation's content would have been produced without a sealer."""


class KafkaEffectSink:
    """Produces each effect as its ``schemas.agent`` record (``RecordProducer.send``)."""

    def __init__(self, producer: RecordSender, settings: VoiceSettings, workflow_id: str,
                 sealer: ContentSealer | None = None, *, tenant: str | None = None,
                 causation: str | None = None, source: str = SOURCE) -> None:
        self._producer = producer
        self._workflow = workflow_id
        self._sealer = sealer
        self._tenant, self._causation, self._source = tenant, causation, source
        self._agent_topic = topic_name(settings, AGENT)
        self._telemetry_topic = topic_name(settings, TELEMETRY)
        self._batch_bytes = min(BATCH_BYTES, settings.max_record_bytes // 2)
        self._pending: list[Awaitable[Any]] = []
        self._display = _Batch()
        self._telemetry = _Batch()
        self._held: _Held | None = None
        """The last model call's record, waiting for the display events after it."""

    async def emit(self, effect: Effect) -> None:
        """Produce the effect's record without waiting for its ack (same key, idempotent
        producer: order holds); ``drain`` waits for them all. Waiting per record cost a turn
        about 30 ms of ack round trips (see docs/benchmarks.md). Display events and telemetry
        wait in their batch, or on a model call's record (see the module docstring)."""
        record = to_record(effect, self._workflow, self._sealer)
        if isinstance(record, TelemetryEvent):
            record = record.model_copy(update={"attributes": {**record.attributes,
                                                              "ts": time.time()}})
            self._add(self._telemetry, self._telemetry_topic, effect, record)
        elif isinstance(record, DisplayEventRecorded):
            held = self._held
            if held is not None and held.takes(_size(record), self._batch_bytes):
                held.after.append(record)
            else:
                self._release()
                self._add(self._display, self._agent_topic, effect, record)
        elif isinstance(record, ModelCallRecorded):
            self._release()
            size, before = _call_size(record), self._display
            if before.records and before.bytes + size > self._batch_bytes:
                self._flush(before, self._agent_topic)  # too big together: as before
            held = _Held(effect.key, effect.turn_id, record, size + before.bytes,
                         datetime.now(UTC), contextvars.copy_context())
            held.before, _key, _turn = before.take()
            self._held = held
        else:  # a tool call's record: the batch waits for the next model call, as before
            self._release()
            self._send(self._agent_topic, effect.key, effect.turn_id, record)

    def _release(self) -> None:
        """Produce the held model call's record, with the display events around it."""
        held, self._held = self._held, None
        if held is None:
            return
        record: Record = held.record
        if held.before or held.after:
            record = ModelCallWithDisplay(**dict(held.record), display_before=held.before,
                                          display_after=held.after)
        self._send(self._agent_topic, held.key, held.turn, record, held.time, held.context)

    def _add(self, batch: _Batch, topic: str, effect: Effect, record: Record) -> None:
        size = _size(record)
        if batch.records and (len(batch.records) >= BATCH_EVENTS
                              or batch.bytes + size > self._batch_bytes):
            self._flush(batch, topic)
        batch.add(effect, record, size)

    def _flush(self, batch: _Batch, topic: str) -> None:
        """Produce what ``batch`` holds: one event as its own record, more as one batch."""
        if not batch.records:
            return
        records, key, turn = batch.take()
        if len(records) == 1:
            record: Record = records[0]
        elif topic == self._telemetry_topic:
            record = TelemetryEvents(events=records)
        else:
            record = DisplayEventsRecorded(workflow=self._workflow, events=records)
        self._send(topic, key, turn, record)

    def _send(self, topic: str, key: str, turn: str, record: Record,
              at: datetime | None = None, context: contextvars.Context | None = None) -> None:
        env = Envelope(record=record, key=self._workflow, source=self._source,
                       subject=turn, tenant=self._tenant,
                       correlation=self._workflow, causation=self._causation, id=key,
                       time=at or datetime.now(UTC))
        # A task per record: tasks start in creation order, so records are produced in order.
        # A held record is produced in the context (the trace) it was made in.
        send = self._producer.send(topic, env)
        self._pending.append(asyncio.ensure_future(send) if context is None
                             else asyncio.get_running_loop().create_task(send, context=context))

    async def drain(self) -> None:
        self._release()
        self._flush(self._display, self._agent_topic)
        self._flush(self._telemetry, self._telemetry_topic)
        pending, self._pending = self._pending, []
        if pending:
            await asyncio.gather(*pending)


@dataclass
class _Held:
    """A model call's record held back for the display events after it (``display_after``)."""

    key: str
    turn: str
    record: ModelCallRecorded
    bytes: int
    time: datetime
    context: contextvars.Context
    before: list[DisplayEventRecorded] = field(default_factory=list)
    after: list[DisplayEventRecorded] = field(default_factory=list)

    def takes(self, size: int, limit: int) -> bool:
        """Whether one more event of ``size`` bytes fits the record's bounds (and counts it)."""
        if len(self.before) + len(self.after) >= BATCH_EVENTS or self.bytes + size > limit:
            return False
        self.bytes += size
        return True


class _Batch:
    """Records waiting to go out as one (the first one's effect key and turn name it)."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.bytes = 0
        self.key = self.turn = ""

    def add(self, effect: Effect, record: Record, size: int) -> None:
        if not self.records:
            self.key, self.turn = effect.key, effect.turn_id
        self.records.append(record)
        self.bytes += size

    def take(self) -> tuple[list[Any], str, str]:
        out = self.records, self.key, self.turn
        self.records, self.bytes = [], 0
        return out


def _size(record: Record) -> int:
    """About how many bytes ``record`` adds to a batch (its content, and a bound for the
    rest), without serialising sealed content."""
    data = getattr(record, "data", None)
    if isinstance(data, Sealed):
        return len(data.ciphertext) + len(data.nonce) + 512
    other = data if data is not None else getattr(record, "attributes", {})
    return len(json.dumps(other, default=str)) + 512


def _call_size(record: ModelCallRecorded) -> int:
    """About how many bytes a model call's record takes (its response, and a bound for the
    rest), without serialising it."""
    response = record.response
    if isinstance(response, Sealed):
        return len(response.ciphertext) + len(response.nonce) + 1024
    return (len(json.dumps(response, default=str)) if response else 0) + 1024


def _content(sealer: ContentSealer | None, conversation: str | None, content_id: str,
             payload: dict[str, Any]) -> Sealed | dict[str, Any]:
    if conversation is None:
        return payload
    if sealer is None:
        raise SealingRequired(f"content {content_id!r} of conversation {conversation!r} "
                              "needs a sealer")
    return sealer.seal_json(conversation, content_id, payload)


def _open(sealer: ContentSealer | None, conversation: str | None, content_id: str,
          value: Sealed | dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(value, Sealed):
        return value
    if sealer is None or conversation is None:
        raise SealingRequired(f"content {content_id!r} is sealed and no sealer was given")
    return sealer.open_json(conversation, content_id, value)


def to_record(effect: Effect, workflow: str, sealer: ContentSealer | None) -> Record:
    """The record an effect becomes, content sealed when it belongs to a conversation."""
    conv, key = effect.conversation_id, effect.key
    if isinstance(effect, ModelCallEffect):
        response = (None if effect.response is None
                    else _content(sealer, conv, f"{key}/response", effect.response))
        return ModelCallRecorded(
            workflow=workflow, call_id=key, agent_name=effect.agent_name,
            iteration=effect.iteration, request_model=effect.request_model,
            response_model=effect.response_model, input_tokens=effect.input_tokens,
            output_tokens=effect.output_tokens,
            cache_read_input_tokens=effect.cache_read_input_tokens,
            cache_creation_input_tokens=effect.cache_creation_input_tokens,
            finish_reasons=effect.finish_reasons, latency_ms=effect.latency_ms,
            cost_usd=effect.cost_usd, fallback_used=effect.fallback_used,
            error_type=effect.error_type, conversation_id=conv, response=response)
    if isinstance(effect, ToolCallEffect):
        return ToolCallRecorded(
            workflow=workflow, tool_call_id=effect.tool_call_id, tool_name=effect.tool_name,
            agent_name=effect.agent_name, envelope=effect.envelope, hint_kind=effect.hint_kind,
            err_kind=effect.err_kind, duration_ms=effect.duration_ms, conversation_id=conv,
            arguments=_content(sealer, conv, f"{key}/arguments", effect.arguments),
            result=_content(sealer, conv, f"{key}/result", effect.result))
    if isinstance(effect, DisplayChunk):
        ev = effect.event
        metadata = {**ev.metadata, "ts": ev.ts}
        return DisplayEventRecorded(
            workflow=workflow, event_id=key, type=ev.type, channel=ev.channel, scope=ev.scope,
            message_id=ev.message_id, verb=ev.verb, priority=ev.priority,
            persistent=ev.persistent, data=_content(sealer, conv, f"{key}/data", ev.data),
            group_id=ev.group_id, parent_id=ev.parent_id, display_id=ev.display_id,
            metadata=metadata)
    if isinstance(effect, PersistMessage):
        payload = {"content": effect.content, "structured_content": effect.structured_content,
                   "cards": effect.cards}
        return DisplayEventRecorded(
            workflow=workflow, event_id=key, type=PERSIST_EVENT, channel="response",
            message_id=effect.turn_id, verb="persist", persistent=True,
            data=_content(sealer, conv, f"{key}/data", payload),
            metadata={"cost_usd": effect.cost_usd, "end_reason": effect.end_reason})
    if isinstance(effect, TelemetryEffect):
        return TelemetryEvent(name=effect.name, conversation_id=conv, workflow=workflow,
                              attributes={**effect.attributes, "turn_id": effect.turn_id,
                                          "effect_key": key})
    raise TypeError(f"not an effect: {effect!r}")


def from_envelope(env: Envelope, sealer: ContentSealer | None = None) -> Effect | None:
    """The effect a record was made from (content opened), or None for other records.

    The turn id travels as the envelope's subject; the effect key as its id.
    """
    rec, key, turn = env.record, env.id, env.subject or ""
    if isinstance(rec, ModelCallRecorded):
        conv = rec.conversation_id
        return ModelCallEffect(
            key=key, turn_id=turn, conversation_id=conv, agent_name=rec.agent_name,
            iteration=rec.iteration, request_model=rec.request_model,
            response_model=rec.response_model, input_tokens=rec.input_tokens,
            output_tokens=rec.output_tokens, cache_read_input_tokens=rec.cache_read_input_tokens,
            cache_creation_input_tokens=rec.cache_creation_input_tokens,
            finish_reasons=rec.finish_reasons, latency_ms=rec.latency_ms,
            cost_usd=rec.cost_usd, fallback_used=rec.fallback_used, error_type=rec.error_type,
            response=_open(sealer, conv, f"{key}/response", rec.response))
    if isinstance(rec, ToolCallRecorded):
        conv = rec.conversation_id
        return ToolCallEffect(
            key=key, turn_id=turn, conversation_id=conv, agent_name=rec.agent_name,
            tool_call_id=rec.tool_call_id, tool_name=rec.tool_name, envelope=rec.envelope,
            hint_kind=rec.hint_kind, err_kind=rec.err_kind, duration_ms=rec.duration_ms,
            arguments=_open(sealer, conv, f"{key}/arguments", rec.arguments) or {},
            result=_open(sealer, conv, f"{key}/result", rec.result) or {})
    return None


def effects_from_envelopes(envs: Iterable[Envelope],
                           sealer: ContentSealer | None = None) -> list[Effect]:
    """Model and tool call effects of a recorded turn, in log order (for ``ReplayClient``)."""
    return [e for e in (from_envelope(env, sealer) for env in envs) if e is not None]
