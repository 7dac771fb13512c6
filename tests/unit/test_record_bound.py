"""No record Voice writes is over ``VOICE_MAX_RECORD_BYTES``: the producer every process uses
refuses one before sending it, a table refuses a value whose changelog record would be, and a
dead letter of a too-large record is cut to fit."""

from __future__ import annotations

from contextlib import closing
from typing import Any

import pytest
from faust.serializers import codecs

from consumers.frame.bounded import BoundedTable, changelog_record
from consumers.frame.context import WorkerContext
from consumers.intake import dead_letter
from schemas.conversation import StartConversation
from streams.envelope import Envelope, encode
from streams.producer import RecordProducer, RecordTooLarge, record_size
from streams.settings import VoiceSettings

LIMIT = 32 * 1024


def settings(**kw: Any) -> VoiceSettings:
    return VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", max_record_bytes=LIMIT, **kw)


async def test_the_producer_refuses_a_record_over_the_bound_and_sends_nothing() -> None:
    producer = RecordProducer(settings())
    try:
        with pytest.raises(RecordTooLarge) as err:
            producer.produce_raw("voice.agent", b"k", b"x" * LIMIT, [("h", b"v")])
        assert err.value.size == LIMIT + 3 and err.value.limit == LIMIT
        assert err.value.too_large and not err.value.retryable
        assert "over the limit of 32768" in str(err.value) and "'voice.agent'" in str(err.value)
        # At the bound exactly it is produced (queued for the broker, which is not there).
        fut = producer.produce_raw("voice.agent", b"k", b"x" * (LIMIT - 1))
        assert not fut.done()
        fut.cancel()
    finally:
        producer._producer.purge()
        producer.close(timeout=0.1)


def test_the_bound_is_below_the_broker_s_limit_and_required() -> None:
    assert VoiceSettings().max_record_bytes == 900_000
    with pytest.raises(ValueError):
        VoiceSettings(max_record_bytes=1_048_588)


def test_a_table_refuses_a_value_whose_changelog_record_is_over_the_bound() -> None:
    with closing(WorkerContext(settings())) as ctx:
        table = ctx.table("sized")
        assert isinstance(table, BoundedTable) and table.max_bytes == LIMIT
        big = {"entries": ["x" * 1000] * 40}
        size = sum(map(len, changelog_record(table, "k", big)))
        assert size == len(codecs.dumps("json", "k")) + len(codecs.dumps("json", big)) > LIMIT
        with pytest.raises(RecordTooLarge, match=r"sized-changelog' \(key 'k'\) is over the "
                                                 r"limit of 32768 bytes "
                                                 r"\(VOICE_MAX_RECORD_BYTES\)"):
            table["k"] = big
        assert "k" not in table, "nothing was stored"


def test_a_table_sends_the_changelog_record_it_measured(monkeypatch: Any) -> None:
    """The value is encoded once (issue 14, eleventh pass): the bytes measured are the bytes
    sent, raw, and they are what Faust's own encoding of the key and value gives. (Sent at
    once: no write held back, ``tests/unit/test_write_behind.py`` holds them.)"""
    with closing(WorkerContext(settings(worker_changelog_linger_s=0))) as ctx:
        table = ctx.table("sized")
        sent: list[tuple[Any, ...]] = []

        class Sent:
            class message:  # noqa: N801  (Faust's FutureMessage.message)
                partition = 0

        def send_changelog(partition: Any, key: Any, value: Any, **kw: Any) -> Any:
            sent.append((partition, key, value, kw))
            return Sent()

        monkeypatch.setattr(table, "send_changelog", send_changelog)
        monkeypatch.setattr(table, "partition_for_key", lambda _key: 0)  # no stream event here
        value = {"seq": 3, "commands": {"c1": {"seq": 2, "turn": "t", "at": "2026-01-01"}},
                 "text": "é ✓", "none": None, "n": [1, 2.5, True]}
        table["k"] = value
        ((_, key, raw, kw),) = sent
        assert kw == {"key_serializer": "raw", "value_serializer": "raw"}
        assert key == codecs.dumps("json", "k") and raw == codecs.dumps("json", value)
        assert codecs.loads("json", raw) == value and table["k"] == value


def test_every_table_of_the_worker_is_bounded(make_worker: Any) -> None:
    worker = make_worker(settings())
    assert worker.app.tables
    assert all(isinstance(t, BoundedTable) and t.max_bytes == LIMIT
               for t in worker.app.tables.values())


class DeadLetters:
    """A producer that refuses records over its bound, as ``RecordProducer`` does."""

    max_bytes = 16 * 1024

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, list[tuple[str, bytes]]]] = []

    async def produce_raw(self, topic: str, key: bytes | None, value: bytes | None,
                          headers: Any = None) -> None:
        if record_size(key, value, headers) > self.max_bytes:
            raise RecordTooLarge(topic, record_size(key, value, headers), self.max_bytes)
        self.sent.append((topic, value, list(headers or [])))


async def test_a_dead_letter_is_cut_to_fit_the_bound() -> None:
    out = DeadLetters()
    env = Envelope(record=StartConversation(conversation="cnv-0123456789abcdef",
                                            owner="x" * 40_000), key="c", source="/t")
    await dead_letter(out, "voice.commands", env, "too large", 0, 7)  # type: ignore[arg-type]
    ((topic, value, headers),) = out.sent
    assert topic == "voice.commands.dlq" and value is not None
    assert len(value) == 8 * 1024
    assert dict(headers)["voice_dlq_truncated"] == str(len(encode(env)[1])).encode()
    assert dict(headers)["voice_dlq_reason"] == b"too large"
