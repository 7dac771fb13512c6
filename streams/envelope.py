"""CloudEvents 1.0 Kafka binary-mode codec for Voice records.

Headers: ``ce_specversion``, ``ce_id``, ``ce_type``, ``ce_source``, ``ce_time``, ``ce_subject``
(written by the ``cloudevents`` library's Kafka binding) and ``content-type``; plus Voice's own
``voice_seq``, ``voice_tenant``, ``voice_correlation``, ``voice_causation``, which are plain Kafka
headers (CloudEvents extension names may not contain ``_``); and the W3C ``traceparent`` (with
``tracestate``) of the span the record was produced in (``streams.tracing``). Key = the
aggregate id.
Value = the JSON of the record's pydantic model.

``decode`` raises ``DecodeError`` with a reason for anything it cannot turn back into a record;
it never lets another exception out, so a consumer can dead-letter the record and go on.

Both ways have a direct path for what Voice itself writes (the headers above, valid, a UTC
time, a JSON payload): the same bytes and the same envelope as the ``cloudevents`` library
gives, without its attribute objects, dict round trip and ``dateutil`` — 3–8 times less CPU a
record (``docs/benchmarks.md``, "Records per turn"). Anything else goes through the library,
which says what is wrong with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from cloudevents.core.bindings.kafka import KafkaMessage, from_binary, to_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from pydantic import ValidationError

from schemas.base import Record, json_bytes, model_for
from streams.entropy import random_uuid_hex
from streams.free_text import fields_of
from streams.tracing import TRACE_HEADERS, TRACEPARENT, inject

SPECVERSION = "1.0"
CONTENT_TYPE = "application/json"
VOICE_HEADERS = ("voice_seq", "voice_tenant", "voice_correlation", "voice_causation")
_FORMAT = JSONFormat()
_SPEC, _JSON = SPECVERSION.encode(), CONTENT_TYPE.encode()
_DIRECT = frozenset({"ce_specversion", "ce_id", "ce_type", "ce_source", "ce_time", "ce_subject",
                     "content-type"})
"""The CloudEvents headers of a record the direct path decodes (what ``encode`` writes)."""
_WRITTEN = _DIRECT | frozenset(VOICE_HEADERS) | frozenset(TRACE_HEADERS)
"""Every header ``encode`` writes: a record with no other is told direct by one set test."""
_UTC_TIME = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")

Headers = list[tuple[str, bytes]]


class DecodeError(Exception):
    """A Kafka record that is not a valid Voice record; ``reason`` says why."""

    plain_message = True
    """Its reason names fields, types and header names, never a payload's values."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Envelope:
    """One Voice record with its CloudEvents and Voice attributes."""

    record: Record
    key: str
    """The aggregate id (conversation, workflow, issue, …); the Kafka message key."""
    source: str
    """Who produced it, e.g. ``/voice/edge`` or ``/voice/sequencer``."""
    subject: str | None = None
    seq: int | None = None
    tenant: str | None = None
    correlation: str | None = None
    causation: str | None = None
    id: str = field(default_factory=random_uuid_hex)
    time: datetime = field(default_factory=lambda: datetime.now(UTC))
    traceparent: str | None = None
    """The W3C trace context it was read with; None on a new envelope, whose ``encode``
    takes the current span's (no header outside a trace)."""

    @property
    def type(self) -> str:
        return self.record.ce_type


def unfolded(env: Envelope) -> list[Envelope]:
    """``env`` and the records it folds (``Record.implied``), each at its own seq, with the
    headers of ``env`` and id ``{id}/{n}``: the log as if every record held one seq, which is
    how readers that render or count records one by one read it."""
    rec = env.record
    if rec.seqs == 1 or env.seq is None:
        return [env]
    return [env, *(replace(env, record=r, seq=env.seq + n, id=f"{env.id}/{n}")
                   for n, r in enumerate(rec.implied(env.seq), start=1))]


def last_seq(env: Envelope) -> int | None:
    """The last seq ``env`` holds (its own, or that of the last record it folds)."""
    return None if env.seq is None else env.seq + env.record.seqs - 1


def new_id() -> str:
    """A fresh record id."""
    return random_uuid_hex()


def encode(env: Envelope) -> tuple[bytes, bytes, Headers]:
    """(key, value, headers) of an envelope, in CloudEvents Kafka binary mode."""
    t = env.time
    if not (env.id and env.source and env.subject != "" and isinstance(t, datetime)
            and t.utcoffset() is not None):
        return _encode_checked(env)  # the library refuses it, saying why
    stamp = t.isoformat()
    if stamp.endswith("+00:00"):
        stamp = stamp[:-6] + "Z"
    # The library's headers, in its order, for an event it would accept (tests hold them equal).
    headers: Headers = [("ce_specversion", _SPEC), ("ce_id", env.id.encode()),
                        ("ce_type", env.type.encode()), ("ce_source", env.source.encode()),
                        ("ce_time", stamp.encode()), ("content-type", _JSON)]
    if env.subject is not None:
        headers.append(("ce_subject", env.subject.encode()))
    return env.key.encode(), json_bytes(env.record), _voice_headers(env, headers)


def _voice_headers(env: Envelope, headers: Headers) -> Headers:
    for name, value in (
        ("voice_seq", env.seq),
        ("voice_tenant", env.tenant),
        ("voice_correlation", env.correlation),
        ("voice_causation", env.causation),
    ):
        if value is not None:
            headers.append((name, str(value).encode()))
    if env.traceparent is not None:
        headers.append((TRACEPARENT, env.traceparent.encode()))
    else:
        headers += inject()
    return headers


def _encode_checked(env: Envelope) -> tuple[bytes, bytes, Headers]:
    """``encode`` through the ``cloudevents`` library (which validates every attribute)."""
    attributes: dict[str, object] = {
        "specversion": SPECVERSION,
        "id": env.id,
        "type": env.type,
        "source": env.source,
        "time": env.time,
        "datacontenttype": CONTENT_TYPE,
    }
    if env.subject is not None:
        attributes["subject"] = env.subject
    event = CloudEvent(attributes=attributes, data=json_bytes(env.record))
    msg = to_binary(event, _FORMAT, key_mapper=lambda _e: env.key)
    return env.key.encode(), msg.value, _voice_headers(env, list(msg.headers.items()))


def _header_map(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, value in headers or ():
        if value is not None:
            out[name] = value
    return out


def decode(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None
) -> Envelope:
    """The envelope of a raw Kafka record, or ``DecodeError`` saying why not."""
    hmap = _header_map(headers)
    direct = _decode_direct(key, value, hmap)
    return direct if direct is not None else _decode_checked(key, value, hmap)


def _decode_direct(key: bytes | None, value: bytes | None, hmap: dict[str, bytes]
                   ) -> Envelope | None:
    """``decode`` of a record as Voice writes it, without the library; None for anything
    else (and for a payload that does not validate), which ``_decode_checked`` then judges."""
    if (key is None or not value or hmap.get("ce_specversion") != _SPEC
            or hmap.get("content-type") != _JSON):
        return None
    if not _WRITTEN.issuperset(hmap):  # a header ``encode`` never writes: is it CloudEvents'?
        ce = [n for n in hmap if n.lower().startswith("ce_") or n.lower() == "content-type"]
        if not _DIRECT.issuperset(ce):
            return None
    stamp = hmap.get("ce_time")
    try:
        ce_type, ce_id, source = (hmap["ce_type"].decode(), hmap["ce_id"].decode(),
                                  hmap["ce_source"].decode())
        subject = hmap["ce_subject"].decode() if "ce_subject" in hmap else None
        aggregate = key.decode()
        if not (ce_type and ce_id and source and subject != "" and stamp is not None
                and _UTC_TIME.fullmatch(stamp)):
            return None
        time = datetime.fromisoformat(stamp.decode())
        # The model's validator itself: ``model_validate_json`` with its defaults, without
        # its Python wrapper (0.7 µs against 1.1 of every decode).
        record = model_for(ce_type).__pydantic_validator__.validate_json(value)
        seq_raw = hmap.get("voice_seq")
        tenant, correlation, causation, trace = (hmap.get("voice_tenant"),
                                                 hmap.get("voice_correlation"),
                                                 hmap.get("voice_causation"),
                                                 hmap.get(TRACEPARENT))
        return _envelope({
            "record": record, "key": aggregate, "source": source, "subject": subject,
            "seq": int(seq_raw) if seq_raw is not None else None,
            "tenant": tenant.decode() if tenant is not None else None,
            "correlation": correlation.decode() if correlation is not None else None,
            "causation": causation.decode() if causation is not None else None,
            "id": ce_id, "time": time,
            "traceparent": trace.decode("latin-1") if trace is not None else None})
    except (KeyError, ValueError):  # ValidationError and UnicodeDecodeError are ValueErrors
        return None


def _envelope(values: dict[str, object]) -> Envelope:
    """``Envelope(**values)`` for ``values`` naming every field (``tests/unit/test_envelope``
    holds them to ``fields(Envelope)``): the frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__`` (1.6 µs of a decode's 7), this fills the instance's dict
    at once (0.4 µs)."""
    env = object.__new__(Envelope)
    env.__dict__.update(values)
    return env


def _decode_checked(key: bytes | None, value: bytes | None, hmap: dict[str, bytes]
                    ) -> Envelope:
    """``decode`` through the ``cloudevents`` library, which names what is wrong."""
    if hmap.get("ce_specversion") != SPECVERSION.encode():
        raise DecodeError(f"ce_specversion is {hmap.get('ce_specversion')!r}, expected '1.0'")
    if key is None:
        raise DecodeError("record has no key (the aggregate id)")
    ce_headers = {k: v for k, v in hmap.items() if k.startswith("ce_") or k == "content-type"}
    try:
        event = from_binary(KafkaMessage(headers=ce_headers, key=key, value=value or b""), _FORMAT)
    except Exception as exc:  # the library raises several types for bad attributes
        raise DecodeError(f"invalid CloudEvents attributes: {exc}") from None
    ce_type = event.get_type()
    try:
        model = model_for(ce_type)
    except KeyError as exc:
        raise DecodeError(str(exc.args[0])) from None
    data = event.get_data()
    try:
        if isinstance(data, dict):
            record = model.model_validate(data)
        elif isinstance(data, (bytes, str)):
            record = model.model_validate_json(data)
        else:
            raise DecodeError(f"{ce_type!r} record has no JSON payload")
    except ValidationError as exc:
        # The fields and error types only: a value could be someone's words (streams.free_text).
        raise DecodeError(f"payload does not match {ce_type!r}: {fields_of(exc)}") from None
    try:
        seq_raw = hmap.get("voice_seq")
        seq = int(seq_raw) if seq_raw is not None else None
        str_or_none = lambda n: hmap[n].decode() if n in hmap else None  # noqa: E731
        return Envelope(
            record=record,
            key=key.decode(),
            source=event.get_source(),
            subject=event.get_subject(),
            seq=seq,
            tenant=str_or_none("voice_tenant"),
            correlation=str_or_none("voice_correlation"),
            causation=str_or_none("voice_causation"),
            id=event.get_id(),
            time=event.get_time() or datetime.now(UTC),
            # Never a reason to refuse a record: a bad trace context is only not continued.
            traceparent=hmap[TRACEPARENT].decode("latin-1") if TRACEPARENT in hmap else None,
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"bad Voice header: {exc}") from None
