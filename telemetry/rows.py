"""Kafka record → telemetry rows in Python: one ``events`` row always, plus a row in the table of
what it records (model call, tool call, workflow step) and an ``event_blobs`` row for a big
payload.

The sink no longer maps records here: ClickHouse derives the same rows from the raw records
(``telemetry.derive``). This mapping stays as the reference the derivation is held to
(``tests/unit/test_telemetry_derive.py``) and as the ``telemetry.raw_insert`` bench baseline.

Mapping never raises: a record ``streams.envelope.decode`` refuses (or one whose mapping fails)
still becomes an ``events`` row with ``ce_type = 'undecodable'`` and the reason, so the sink
keeps going and the analyst sees the bad record.

The payload is stored exactly as produced (the record's JSON). Conversation content in it is
``Sealed`` (base64 ciphertext) — the sink holds no key and never opens or re-serialises it, so
sealed stays sealed. Derived tables carry only the non-content columns of a record.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from schemas.agent import ModelCallRecorded, ToolCallRecorded
from schemas.base import Record
from schemas.workflow import (
    LastStepSucceeded,
    StepFailed,
    StepStarted,
    StepSucceeded,
    WorkflowCompleted,
    WorkflowFailed,
    WorkflowPaused,
    WorkflowResumed,
    WorkflowStarted,
)
from streams.envelope import DecodeError, Envelope, decode
from streams.free_text import describe
from streams.tracing import ids_of
from telemetry.derive import BLOB_THRESHOLD, COMPLETED_ROW
from telemetry.schema import DATABASE, column_names

UNDECODABLE = "undecodable"


@dataclass(frozen=True)
class RawRecord:
    """What the sink needs of one Kafka record (a ``confluent_kafka.Message`` without the C)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp_ms: int | None = None

    @classmethod
    def from_message(cls, msg: Any) -> RawRecord:
        ts_type, ts = msg.timestamp()
        return cls(
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            key=msg.key(),
            value=msg.value(),
            headers=tuple(msg.headers() or ()),
            timestamp_ms=ts if ts_type and ts > 0 else None,
        )


@dataclass
class Rows:
    """Rows per table, each a list in ``telemetry.schema.COLUMNS`` order."""

    tables: dict[str, list[list[Any]]] = field(default_factory=dict)

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.tables.setdefault(table, []).append([row.get(c) for c in column_names(table)])

    def extend(self, other: Rows) -> None:
        for table, rows in other.tables.items():
            self.tables.setdefault(table, []).extend(rows)

    def count(self, table: str) -> int:
        return len(self.tables.get(table, ()))

    def as_dicts(self, table: str) -> list[dict[str, Any]]:
        """The rows of one table as dicts (for tests and debugging)."""
        names = column_names(table)
        return [dict(zip(names, r, strict=True)) for r in self.tables.get(table, ())]


class KindCache:
    """Workflow id → kind, learnt from ``WorkflowStarted``; bounded so memory stays flat."""

    def __init__(self, size: int = 100_000) -> None:
        self._kinds: OrderedDict[str, str] = OrderedDict()
        self._size = size

    def learn(self, workflow: str, kind: str) -> None:
        self._kinds[workflow] = kind
        self._kinds.move_to_end(workflow)
        while len(self._kinds) > self._size:
            self._kinds.popitem(last=False)

    def get(self, workflow: str) -> str:
        return self._kinds.get(workflow, "")


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _text(b: bytes | None) -> str:
    return b.decode("utf-8", "replace") if b is not None else ""


def _payload(value: bytes) -> tuple[str, str]:
    """(payload text, encoding): UTF-8 text as is, other bytes as base64 — never lossy."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), "base64"
    return text, "text"


def map_record(raw: RawRecord, kinds: KindCache | None = None) -> Rows:
    """The rows of one Kafka record. Never raises."""
    try:
        env: Envelope | None = decode(raw.key, raw.value, raw.headers)
        reason = None
    except DecodeError as exc:
        env, reason = None, exc.reason
    except Exception as exc:  # decode promises DecodeError only; a bug must not stop the sink
        env, reason = None, f"decoder failed: {describe(exc)}"
    if env is not None:
        try:
            return _decoded_rows(raw, env, kinds)
        except Exception as exc:
            reason = f"mapping failed: {describe(exc)}"
    return _undecodable_rows(raw, reason or "unknown")


def _headers(raw: RawRecord) -> dict[str, str]:
    # Headers are CloudEvents/Voice metadata (ids, types, DLQ reasons), never content.
    return {name: _text(value) for name, value in raw.headers if value is not None}


def _event_row(raw: RawRecord, event_id: str, payload: str, encoding: str) -> tuple[Rows, dict]:
    """The common part of an events row, moving a big payload into ``event_blobs``."""
    rows = Rows()
    size = len(raw.value or b"")
    blob_id = None
    if size >= BLOB_THRESHOLD:
        # Position-derived, so a re-read of the same record writes the same blob row (deduped).
        blob_id = f"{raw.topic}/{raw.partition}/{raw.offset}"
        rows.add("event_blobs", {
            "blob_id": blob_id, "event_id": event_id, "topic": raw.topic,
            "partition": raw.partition, "offset": raw.offset,
            "payload_encoding": encoding, "payload": payload, "payload_bytes": size,
        })
        summary = {
            "blob_id": blob_id, "payload_bytes": size, "payload_encoding": encoding,
            "sha256": hashlib.sha256(raw.value or b"").hexdigest(),
            "table": f"{DATABASE}.event_blobs",
        }
        payload, encoding = json.dumps(summary), "blob"
    row = {
        "event_id": event_id, "topic": raw.topic, "partition": raw.partition,
        "offset": raw.offset, "headers": _headers(raw), "payload": payload,
        "payload_encoding": encoding, "payload_blob_id": blob_id, "payload_bytes": size,
    }
    return rows, row


def _undecodable_rows(raw: RawRecord, reason: str) -> Rows:
    h = _headers(raw)
    payload, encoding = _payload(raw.value or b"")
    rows, row = _event_row(raw, h.get("ce_id", ""), payload, encoding)
    ts = raw.timestamp_ms
    row.update({
        "ce_type": UNDECODABLE, "source": h.get("ce_source", ""), "subject": h.get("ce_subject"),
        "aggregate_key": _text(raw.key), "seq": None, "tenant": h.get("voice_tenant"),
        "correlation": h.get("voice_correlation"), "causation": h.get("voice_causation"),
        "time": datetime.fromtimestamp(ts / 1000, UTC) if ts else datetime.now(UTC),
        "decode_error": reason, **_trace(None, None, h.get("traceparent")),
    })
    rows.add("events", row)
    return rows


def _decoded_rows(raw: RawRecord, env: Envelope, kinds: KindCache | None) -> Rows:
    # The value is stored as produced (not re-dumped from the model), byte for byte.
    payload = (raw.value or b"").decode("utf-8")
    rows, row = _event_row(raw, env.id, payload, "json")
    time = _utc(env.time)
    row.update({
        "ce_type": env.type, "source": env.source, "subject": env.subject,
        "aggregate_key": env.key, "seq": env.seq, "tenant": env.tenant,
        "correlation": env.correlation, "causation": env.causation, "time": time,
        "decode_error": None, **_trace(None, None, env.traceparent),
    })
    rows.add("events", row)
    # A dead-lettered copy is the same fact as the original: count it once, in events only.
    if not raw.topic.endswith(".dlq"):
        _derived(rows, env.record, env, time, kinds)
    return rows


def _derived(rows: Rows, rec: Record, env: Envelope, time: datetime, kinds: KindCache | None
             ) -> None:
    base = {"event_id": env.id, "time": time, "tenant": env.tenant}
    if isinstance(rec, ModelCallRecorded):
        # Every column but ``response``: that is content (sealed) and stays in events only.
        fields = rec.model_dump(exclude={"response"})
        rows.add("model_calls", {**fields, **base,
                                 **_trace(rec.trace_id, rec.span_id, env.traceparent)})
    elif isinstance(rec, ToolCallRecorded):
        fields = rec.model_dump(exclude={"arguments", "result"})
        rows.add("tool_calls", {**fields, **base, "operation_name": "execute_tool",
                                **_trace(rec.trace_id, rec.span_id, env.traceparent)})
    elif isinstance(rec, LastStepSucceeded):
        # Two rows, as its two v1 records made: the step's success (the record's id) and the
        # workflow's end (``COMPLETED_ROW`` after it: the table keeps one row per id).
        kind = kinds.get(rec.workflow) if kinds is not None else ""
        common = {"workflow": rec.workflow, "kind": kind, **base, "seq": env.seq}
        rows.add("workflow_steps", {**common, "scope": "step", "step": rec.step,
                                    "attempt": rec.attempt, "status": "succeeded"})
        rows.add("workflow_steps", {**common, "event_id": env.id + COMPLETED_ROW,
                                    "scope": "workflow", "step": "", "status": "completed"})
    else:
        step = _workflow_row(rec)
        if step is None:
            return
        workflow = step["workflow"]
        if isinstance(rec, WorkflowStarted) and kinds is not None:
            kinds.learn(workflow, rec.kind)
        step.setdefault("kind", kinds.get(workflow) if kinds is not None else "")
        rows.add("workflow_steps", {**step, **base, "seq": env.seq})


def _trace(trace_id: str | None, span_id: str | None, traceparent: str | None
           ) -> dict[str, str | None]:
    """The trace and span a record belongs to: the record's own ids when it has them, else
    its ``traceparent`` header's (the engine produces each call's record inside its span)."""
    if trace_id is None and span_id is None:
        trace_id, span_id = ids_of(traceparent)
    return {"trace_id": trace_id, "span_id": span_id}


def _workflow_row(rec: Record) -> dict[str, Any] | None:
    if isinstance(rec, WorkflowStarted):
        return {"workflow": rec.workflow, "kind": rec.kind, "scope": "workflow", "step": "",
                "status": "started"}
    if isinstance(rec, StepStarted):
        return {"workflow": rec.workflow, "scope": "step", "step": rec.step,
                "attempt": rec.attempt, "status": "started", "worker": rec.worker}
    if isinstance(rec, StepSucceeded):
        return {"workflow": rec.workflow, "scope": "step", "step": rec.step,
                "attempt": rec.attempt, "status": "succeeded"}
    # ``error`` is plain (a code, Voice's own words); a message that may quote someone is
    # sealed in the payload and never copied into a column.
    if isinstance(rec, StepFailed):
        return {"workflow": rec.workflow, "scope": "step", "step": rec.step,
                "attempt": rec.attempt, "status": "failed", "error": rec.error,
                "error_type": rec.error_type, "retryable": rec.retryable}
    if isinstance(rec, WorkflowPaused):
        return {"workflow": rec.workflow, "scope": "step", "step": rec.step,
                "status": "paused", "waiting_for": rec.waiting_for}
    if isinstance(rec, WorkflowResumed):
        return {"workflow": rec.workflow, "scope": "step", "step": rec.step,
                "status": "resumed"}
    if isinstance(rec, WorkflowCompleted):
        return {"workflow": rec.workflow, "scope": "workflow", "step": "",
                "status": "completed"}
    if isinstance(rec, WorkflowFailed):
        return {"workflow": rec.workflow, "scope": "workflow", "step": rec.step,
                "attempt": rec.attempts, "status": "failed", "error": rec.error}
    return None


def fallback_rows(raw: RawRecord, reason: str) -> Rows:
    """An ``undecodable`` events row for a record whose own rows the store refused: its
    place, headers, key, payload and ``reason`` (the sink's last word on it)."""
    return _undecodable_rows(raw, reason)
