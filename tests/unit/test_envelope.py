"""The CloudEvents Kafka binary-mode codec: headers, round trip, and every way decode refuses."""

from __future__ import annotations

import json

import pytest

from schemas.conversation import StartConversation
from streams.envelope import DecodeError, Envelope, decode, encode


def _env(**kw: object) -> Envelope:
    base = dict(record=StartConversation(conversation="cnv-0123456789abcdef", owner="alice"),
                key="cnv-0123456789abcdef", source="/voice/edge", subject="cnv-0123456789abcdef",
                seq=7, tenant="acme", correlation="req-1", causation="rec-0")
    base.update(kw)
    return Envelope(**base)  # type: ignore[arg-type]


def test_binary_mode_headers_and_key() -> None:
    key, value, headers = encode(_env())
    h = dict(headers)
    assert key == b"cnv-0123456789abcdef"
    assert h["ce_specversion"] == b"1.0"
    assert h["ce_type"] == b"voice.conversation.start.v1"
    assert h["ce_source"] == b"/voice/edge"
    assert h["ce_subject"] == b"cnv-0123456789abcdef"
    assert h["ce_id"] and h["ce_time"].endswith(b"Z")
    assert h["voice_seq"] == b"7" and h["voice_tenant"] == b"acme"
    assert h["voice_correlation"] == b"req-1" and h["voice_causation"] == b"rec-0"
    assert json.loads(value) == {"conversation": "cnv-0123456789abcdef", "owner": "alice"}


def test_round_trip() -> None:
    env = _env()
    back = decode(*encode(env))
    assert back.record == env.record
    assert (back.id, back.key, back.seq, back.tenant, back.correlation, back.causation) == (
        env.id, env.key, 7, "acme", "req-1", "rec-0")
    assert back.time == env.time


def test_optional_headers_absent() -> None:
    _, _, headers = encode(_env(seq=None, tenant=None, correlation=None, causation=None,
                                subject=None))
    names = {h for h, _ in headers}
    assert not names & {"voice_seq", "voice_tenant", "voice_correlation", "voice_causation",
                        "ce_subject"}


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda k, v, h: (k, b"\x00\xff garbage", h), "payload"),
        (lambda k, v, h: (k, v, []), "ce_specversion"),
        (lambda k, v, h: (None, v, h), "no key"),
        (lambda k, v, h: (k, v, [(n, b"voice.nope.v1" if n == "ce_type" else x) for n, x in h]),
         "unknown record type"),
        (lambda k, v, h: (k, b'{"conversation": "bad id", "owner": "a"}', h), "does not match"),
        (lambda k, v, h: (k, v, [(n, b"x" if n == "voice_seq" else x) for n, x in h]),
         "bad Voice header"),
        (lambda k, v, h: (k, None, h), "payload"),
    ],
)
def test_decode_refuses_with_reason(mutate, reason: str) -> None:  # noqa: ANN001
    with pytest.raises(DecodeError) as err:
        decode(*mutate(*encode(_env())))
    assert reason in err.value.reason


def test_records_are_frozen() -> None:
    rec = StartConversation(conversation="cnv-0123456789abcdef", owner="alice")
    with pytest.raises(ValueError):
        rec.owner = "mallory"  # type: ignore[misc]


# --- the direct paths give what the library gives --------------------------------------------


def _samples() -> list[Envelope]:
    from datetime import UTC, datetime, timedelta, timezone

    from schemas.agent import DisplayEventRecorded, DisplayEventsRecorded
    from schemas.base import Sealed
    from schemas.conversation import ReplyRecorded

    sealed = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy" * 9)
    reply = ReplyRecorded(conversation="cnv-0123456789abcdef", turn="cnv-0123456789abcdef:turn-2",
                          reply_id="r", text=sealed)
    batch = DisplayEventsRecorded(workflow="w", events=[
        DisplayEventRecorded(workflow="w", event_id=f"w/d{i}", type="busy",
                             data={"text": "é ✓ \u2028"}, metadata={"ts": 1.5}) for i in (1, 2)])
    whole = datetime(2026, 12, 1, 11, 0, 0, tzinfo=UTC)
    return [_env(), _env(subject=None, seq=None, tenant=None, correlation=None, causation=None),
            _env(record=reply, time=whole), _env(record=batch, traceparent="00-" + "a" * 32
                                                  + "-" + "b" * 16 + "-01"),
            _env(time=datetime(2026, 12, 1, 12, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))),
            _env(key="cnv-ünïcode", source="/voice/édge", id="id-ü")]


@pytest.mark.parametrize("env", _samples())
def test_a_records_value_is_its_model_dump_json(env: Envelope) -> None:
    """``json_bytes`` (the serializer without ``model_dump_json``'s wrapper) writes the same
    bytes, sealed fields, datetimes, nested records and odd text included."""
    from schemas.base import json_bytes

    assert json_bytes(env.record) == env.record.model_dump_json().encode()
    assert encode(env)[1] == env.record.model_dump_json().encode()


@pytest.mark.parametrize("env", _samples())
def test_the_direct_paths_are_the_librarys(env: Envelope) -> None:
    """``encode`` writes the bytes the ``cloudevents`` library writes, and ``decode`` of them
    gives the envelope the library's path gives."""
    from streams.envelope import _decode_checked, _encode_checked, _header_map

    fast, slow = encode(env), _encode_checked(env)
    assert fast == slow
    key, value, headers = fast
    assert decode(key, value, headers) == _decode_checked(key, value, _header_map(headers))
    assert decode(key, value, headers) == env


@pytest.mark.parametrize("env", _samples())
def test_a_direct_decode_is_an_envelope_like_any_other(env: Envelope) -> None:
    """The direct path fills the instance without ``__init__``: every field is there, no
    other attribute is, and it hashes, compares and is replaced as one made by ``__init__``."""
    import contextlib
    import dataclasses

    got = decode(*encode(env))
    assert set(vars(got)) == {f.name for f in dataclasses.fields(Envelope)}
    assert type(got) is Envelope and got == env
    with contextlib.suppress(TypeError):  # a record holding a list is not hashable at all
        assert hash(got) == hash(env)
    assert dataclasses.replace(got, seq=99) == dataclasses.replace(env, seq=99)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.seq = 1  # type: ignore[misc]


@pytest.mark.parametrize("mutate", [
    lambda h: [(n.upper() if n == "ce_id" else n, v) for n, v in h],  # library lower-cases
    lambda h: [*h, ("ce_extra", b"x")],
    lambda h: [*h, ("CE_EXTRA", b"x")],  # a header encode never writes, CloudEvents' by case
    lambda h: [*h, ("Content-Type", b"text/plain")],
    lambda h: [(n, b"2026-12-01T11:00:00+01:00" if n == "ce_time" else v) for n, v in h],
    lambda h: [(n, v) for n, v in h if n != "ce_time"],
    lambda h: [(n, b"text/plain" if n == "content-type" else v) for n, v in h],
    lambda h: [(n, b"" if n == "ce_source" else v) for n, v in h],
])
def test_anything_else_is_judged_by_the_library(mutate) -> None:  # noqa: ANN001
    """Headers Voice does not write as it writes them are left to the library: same envelope
    or same refusal as before the direct path (an id or a time the record lacks is made up
    afresh by each decode, so those two are not compared)."""
    import dataclasses
    from datetime import UTC, datetime

    from streams.envelope import _decode_checked, _decode_direct, _header_map

    def same(env: Envelope) -> Envelope:
        return dataclasses.replace(env, id="", time=datetime(2000, 1, 1, tzinfo=UTC))

    key, value, headers = encode(_env())
    changed = mutate(headers)
    assert _decode_direct(key, value, _header_map(changed)) is None
    try:
        expected: object = same(_decode_checked(key, value, _header_map(changed)))
    except DecodeError as exc:
        expected = exc.reason
    try:
        got: object = same(decode(key, value, changed))
    except DecodeError as exc:
        got = exc.reason
    assert got == expected


def test_an_envelope_the_library_refuses_is_still_refused() -> None:
    from cloudevents.core.exceptions import BaseCloudEventException

    for bad in (_env(id=""), _env(source=""), _env(subject="")):
        with pytest.raises(BaseCloudEventException):
            encode(bad)
