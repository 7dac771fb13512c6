"""Records of agent turns (topic voice.agent, key = workflow id): every model call, tool call and
display event (several display events of a turn in a row as one ``DisplayEventsRecorded``; since
issue 14's third pass, on the model call's record they come before or after,
``ModelCallWithDisplay``).
Content a participant wrote or a model produced is ``Sealed`` with the conversation's key when
the turn belongs to a conversation, so replay can serve it back and erasure still has one place
to act.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.base import Record, Sealed, record_type

EnvelopeKind = Literal["ok", "hint", "err"]


@record_type("voice.agent.model_call.v1")
class ModelCallRecorded(Record):
    """One model call, its usage and its full response (for replay), in OTel GenAI terms."""

    workflow: str
    call_id: str
    agent_name: str
    iteration: int = Field(ge=1)
    operation_name: str = "chat"
    provider_name: str = "anthropic"
    request_model: str
    response_model: str | None = None
    input_tokens: int = 0
    """Including cache reads and writes, as the OTel GenAI conventions count them."""
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    finish_reasons: list[str] = []
    latency_ms: float = 0.0
    cost_usd: float = 0.0
    fallback_used: bool = False
    error_type: str | None = None
    conversation_id: str | None = None
    trace_id: str | None = None
    span_id: str | None = None
    response: Sealed | dict[str, Any] | None = None
    """The response content blocks (sealed for conversations) that replay serves back."""


@record_type("voice.agent.tool_call.v1")
class ToolCallRecorded(Record):
    """One tool call and its envelope; the result is what replay serves back."""

    workflow: str
    tool_call_id: str
    tool_name: str
    agent_name: str
    envelope: EnvelopeKind
    hint_kind: str | None = None
    err_kind: str | None = None
    duration_ms: float = 0.0
    conversation_id: str | None = None
    trace_id: str | None = None
    span_id: str | None = None
    arguments: Sealed | dict[str, Any] = {}
    result: Sealed | dict[str, Any] = {}


@record_type("voice.agent.display_event.v1")
class DisplayEventRecorded(Record):
    """A display event an SSE client sees (``text_delta``, ``tool_call``, ``done``, …)."""

    workflow: str
    event_id: str
    type: str
    channel: str = "main"
    scope: str = "turn"
    message_id: str | None = None
    verb: str | None = None
    priority: int = 0
    persistent: bool = True
    data: Sealed | dict[str, Any] = {}
    group_id: str | None = None
    parent_id: str | None = None
    display_id: str | None = None
    metadata: dict[str, Any] = {}


@record_type("voice.telemetry.event.v1")
class TelemetryEvent(Record):
    """A telemetry fact (labels, envelopes, costs) with no conversation content in it."""

    name: str
    conversation_id: str | None = None
    workflow: str | None = None
    attributes: dict[str, Any] = {}


@record_type("voice.agent.display_events.v1")
class DisplayEventsRecorded(Record):
    """Display events of one turn emitted in a row (between two model or tool calls, or at its
    end), in order, as one record: each is what one ``DisplayEventRecorded`` would hold, its
    ``data`` sealed under its own ``<event_id>/data`` as there. A reader takes ``events``
    where it took one record."""

    workflow: str
    events: list[DisplayEventRecorded] = Field(min_length=1)


@record_type("voice.agent.model_call.v2")
class ModelCallWithDisplay(ModelCallRecorded):
    """A model call's record (v1's fields) carrying the turn's display events around it, so
    a turn writes no record of its own for them: ``display_before`` were emitted since the
    turn's previous agent record and before this call's, ``display_after`` after it, before
    the turn's next agent record (or its end). Each is what one ``DisplayEventRecorded``
    would hold, its ``data`` sealed under its own ``<event_id>/data``. A reader of model calls
    takes it as one (it is a ``ModelCallRecorded``); ``agent_parts`` gives the records it
    stands for, in log order."""

    display_before: list[DisplayEventRecorded] = []
    display_after: list[DisplayEventRecorded] = []


@record_type("voice.telemetry.events.v1")
class TelemetryEvents(Record):
    """A turn's telemetry facts, in order, as one record (produced when the turn's effects
    drain): each is what one ``TelemetryEvent`` would hold, with its time (``ts``, Unix
    seconds) among its ``attributes``. A reader takes ``events`` where it took one record."""

    events: list[TelemetryEvent] = Field(min_length=1)


def telemetry_events(record: Record) -> list[TelemetryEvent]:
    """The telemetry facts a ``voice.telemetry`` record holds, in either shape."""
    if isinstance(record, TelemetryEvents):
        return list(record.events)
    return [record] if isinstance(record, TelemetryEvent) else []


def display_events(record: Record) -> list[DisplayEventRecorded]:
    """The display events a ``voice.agent`` record holds, in any shape, in order."""
    if isinstance(record, DisplayEventsRecorded):
        return list(record.events)
    if isinstance(record, ModelCallWithDisplay):
        return [*record.display_before, *record.display_after]
    return [record] if isinstance(record, DisplayEventRecorded) else []


def agent_parts(record: Record) -> list[Record]:
    """The records of the first shapes a ``voice.agent`` record stands for, in log order: a
    batch's events one by one; a ``ModelCallWithDisplay``'s events before, its call as a
    ``ModelCallRecorded``, its events after; any other record itself."""
    if isinstance(record, DisplayEventsRecorded):
        return list(record.events)
    if isinstance(record, ModelCallWithDisplay):
        call = ModelCallRecorded.model_validate(
            {k: v for k, v in record if k not in ("display_before", "display_after")})
        return [*record.display_before, call, *record.display_after]
    return [record]
