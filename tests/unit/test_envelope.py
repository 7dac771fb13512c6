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
