"""Kafka records as the sink hands them to ClickHouse: raw columns, one Arrow table per insert.

The sink does per record only what ClickHouse cannot: say whether the record is a valid Voice
record (the verdict every consumer reaches with ``streams.envelope.decode``, here checked
without building the envelope: the CloudEvents headers, then the payload against its model by
pydantic's JSON validator), note its ``voice_seq``, and the kind of a workflow it saw start.
Everything else — header values, time, the payload's fields, big payloads — is parsed by the
materialized views of ``telemetry.derive``.

Never raises for a record: anything the quick check does not accept goes through ``decode`` for
its exact reason. Never opens sealed content (it holds no key; the payload goes in as produced).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import pyarrow as pa

from schemas.base import Record, model_for
from schemas.workflow import WorkflowStarted
from streams.envelope import VOICE_HEADERS, DecodeError, decode
from streams.free_text import describe
from telemetry.derive import WORKFLOW_TYPES
from telemetry.rows import KindCache, RawRecord

_ARROW = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.uint32()),
    ("offset", pa.uint64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", pa.map_(pa.string(), pa.binary())),
    ("kafka_ms", pa.int64()),
    ("decode_error", pa.string()),
    ("seq", pa.int64()),
    ("kind", pa.string()),
])
"""The columns of ``voice.envelopes`` (``telemetry.derive.LANDING_COLUMNS``), as Arrow types."""

_WORKFLOW = frozenset(WORKFLOW_TYPES)


class Verdict(NamedTuple):
    """What the sink says of one record: ``error`` is None for a valid Voice record.

    (A tuple, not a dataclass: one is made per record, and a frozen dataclass costs ~4× as
    much to build.)"""

    error: str | None
    seq: int | None = None
    kind: str = ""


_VALIDATE: dict[bytes, Callable[[bytes], Any]] = {}
"""``ce_type`` header bytes → the model's JSON validator: ``model_for`` without decoding the
header per record, and pydantic-core's ``validate_json`` without ``model_validate_json``'s
Python frame around it (the same call with the same defaults: the same verdict)."""

_TEXT_HEADERS = VOICE_HEADERS[1:]
"""Voice headers that must be UTF-8 (``voice_seq`` must be an integer, checked by ``int``)."""


def _validator(ce_type: bytes) -> Callable[[bytes], Any]:
    validate = _VALIDATE.get(ce_type)
    if validate is None:
        model = model_for(ce_type.decode())
        validate = model.__pydantic_validator__.validate_json
        if model.__pydantic_complete__:  # else a placeholder: look it up again next time
            _VALIDATE[ce_type] = validate
    return validate


def _check(key: bytes | None, value: bytes | None, headers: Any) -> tuple[Record, int | None]:
    """The record and its seq when every check of ``decode`` passes; raises otherwise."""
    h = dict(headers) if headers else {}
    if None in h.values():  # decode() ignores a header without a value: so must we
        h = {n: v for n, v in headers if v is not None}
    if key is None or h.get("ce_specversion") != b"1.0" or not h.get("ce_id"):
        raise ValueError
    if not h.get("ce_source"):
        raise ValueError
    validate = _validator(h["ce_type"])
    t = h.get("ce_time")
    if t is not None:
        datetime.fromisoformat(t.decode())
    record: Record = validate(value or b"")
    for name in _TEXT_HEADERS:
        if name in h:
            h[name].decode()
    s = h.get("voice_seq")
    key.decode()
    return record, int(s) if s is not None else None


def verdict(topic: str, key: bytes | None, value: bytes | None, headers: Any,
            kinds: KindCache | None = None) -> Verdict:
    """Whether a record is a valid Voice record (and its seq, its workflow's kind). Never
    raises."""
    try:
        record, seq = _check(key, value, headers)
    except Exception:
        # The quick check is stricter than it needs to be, never looser: what it refuses,
        # decode() decides, with its exact reason.
        try:
            env = decode(key, value, headers)
        except DecodeError as exc:
            return Verdict(exc.reason)
        except Exception as exc:  # decode promises DecodeError only; a bug must not stop us
            return Verdict(f"decoder failed: {describe(exc)}")
        record, seq = env.record, env.seq
    kind = ""
    if type(record) in _WORKFLOW and not topic.endswith(".dlq"):
        workflow: str = record.workflow  # type: ignore[attr-defined]
        if isinstance(record, WorkflowStarted):
            if kinds is not None:
                kinds.learn(workflow, record.kind)
            kind = record.kind
        elif kinds is not None:
            kind = kinds.get(workflow)
    return Verdict(None, seq, kind)


@dataclass
class Columns:
    """Records in arrival order, column by column, as ``voice.envelopes`` takes them."""

    topic: list[str] = field(default_factory=list)
    partition: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    key: list[bytes | None] = field(default_factory=list)
    value: list[bytes] = field(default_factory=list)
    headers: list[tuple[tuple[str, bytes | None], ...]] = field(default_factory=list)
    """Tuples, not the lists Kafka hands out: the collector stops tracking a tuple of strings
    and bytes, while a list held for a whole batch is promoted to its oldest generation, and
    every ~25,000 of them cost a full collection of the process (~5 µs a record, measured)."""
    kafka_ms: list[int | None] = field(default_factory=list)
    decode_error: list[str | None] = field(default_factory=list)
    seq: list[int | None] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offset)

    def add(self, topic: str, partition: int, offset: int, key: bytes | None,
            value: bytes | None, headers: Any, kafka_ms: int | None, v: Verdict) -> None:
        self.topic.append(topic)
        self.partition.append(partition)
        self.offset.append(offset)
        self.key.append(key)
        self.value.append(value or b"")
        self.headers.append(tuple(headers) if headers else ())
        self.kafka_ms.append(kafka_ms)
        self.decode_error.append(v.error)
        self.seq.append(v.seq)
        self.kind.append(v.kind)

    def add_messages(self, msgs: list[Any], kinds: KindCache) -> list[int]:
        """Judge and append Kafka messages (none of them an error); returns the rows whose
        verdict is not a valid record.

        ``add`` for a whole ``consume`` result: the sink's one loop over records, its column
        appends bound once (this saves ~0.1 µs a record, measured; the time is in
        ``verdict`` and in librdkafka's ``headers()``, docs/benchmarks.md)."""
        topic_, partition_, offset_ = (self.topic.append, self.partition.append,
                                       self.offset.append)
        key_, value_, headers_ = self.key.append, self.value.append, self.headers.append
        kafka_ms_, error_ = self.kafka_ms.append, self.decode_error.append
        seq_, kind_ = self.seq.append, self.kind.append
        refused: list[int] = []
        row = len(self.offset)
        for msg in msgs:
            topic, key, value, headers = msg.topic(), msg.key(), msg.value(), msg.headers()
            v = verdict(topic, key, value, headers, kinds)
            ts_type, ts = msg.timestamp()
            topic_(topic)
            partition_(msg.partition())
            offset_(msg.offset())
            key_(key)
            value_(value or b"")
            headers_(tuple(headers) if headers else ())
            kafka_ms_(ts if ts_type and ts > 0 else None)
            error_(v.error)
            seq_(v.seq)
            kind_(v.kind)
            if v.error is not None:
                refused.append(row)
            row += 1
        return refused

    def add_raw(self, raw: RawRecord, v: Verdict) -> None:
        self.add(raw.topic, raw.partition, raw.offset, raw.key, raw.value, raw.headers,
                 raw.timestamp_ms, v)

    def raw(self, i: int) -> RawRecord:
        """Record ``i`` as it came (for a dead letter, or to insert it alone)."""
        return RawRecord(self.topic[i], self.partition[i], self.offset[i], self.key[i],
                         self.value[i], self.headers[i], self.kafka_ms[i])

    def arrow(self, rows: range | list[int] | None = None) -> pa.Table:
        """The records (all, or those at ``rows``) as one Arrow table. A value Arrow cannot
        hold (a seq past Int64) raises ``pa.ArrowException``: the store's refusal of them."""
        names = _ARROW.names
        cols = [getattr(self, n) for n in names]
        if rows is not None:
            cols = [[c[i] for i in rows] for c in cols]
        return pa.table([pa.array(c, type=_ARROW.field(n).type) for n, c in zip(names, cols,
                                                                              strict=True)],
                        schema=_ARROW)


def one(raw: RawRecord, error: str) -> pa.Table:
    """``raw`` alone, with the sink's last word on it (it is then an ``undecodable`` row)."""
    cols = Columns()
    cols.add_raw(raw, Verdict(error))
    return cols.arrow()
