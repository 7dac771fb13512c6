"""Reads by position served from the records a worker consumed lately (issue 14, fifth pass).

A step reads back what its worker's consumer of the log has just decoded; ``RecentRecords``
holds those records by where they are, bounded, and checks each position as a fetch does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from consumers.frame.logrefs import KafkaLogReader, LogUnavailable, Position, RecentRecords
from schemas.conversation import ConversationStarted
from streams.envelope import Envelope
from streams.topics import CONVERSATIONS
from tests.unit import test_consumer_failures as failures
from tests.unit.test_consumer_failures import CNV, SETTINGS, event, run_agent, worker

close_workers = failures.close_workers
"""Autouse, from where ``worker`` is: closes the workers it made (their key store's consumer
would reconnect to the absent broker for the rest of the session)."""

TOPIC = "t.voice.conversations"


def record(seq: int, key: str = CNV) -> Envelope:
    return Envelope(record=ConversationStarted(conversation=key, owner="alice"), key=key,
                    source="/test", seq=seq, id=f"{key}:{seq}")


def test_every_position_held_is_served_in_the_order_asked_and_checked() -> None:
    recent = RecentRecords()
    for offset, seq in ((10, 1), (12, 2), (15, 3)):
        recent.remember(TOPIC, 0, offset, record(seq), 300)
    got = recent.held(TOPIC, 0, CNV, [Position(3, 15), Position(1, 10)])
    assert got is not None and [e.seq for e in got] == [3, 1]
    assert recent.held(TOPIC, 0, CNV, [Position(1, 10), Position(4, 16)]) is None  # one missing
    assert recent.held(TOPIC, 1, CNV, [Position(1, 10)]) is None  # another partition
    with pytest.raises(LogUnavailable, match="holds seq 2") as bad:
        recent.held(TOPIC, 0, CNV, [Position(5, 12)])  # not the seq indexed there
    assert bad.value.retryable is False
    with pytest.raises(LogUnavailable, match="cnv-other"):
        recent.held(TOPIC, 0, "cnv-other", [Position(1, 10)])  # another key's record


def test_the_least_recently_used_go_first_past_the_budget() -> None:
    recent = RecentRecords(budget=4000)  # of memory: a 400-byte record weighs 1,600 decoded
    for offset in range(3):
        recent.remember(TOPIC, 0, offset, record(offset + 1), 400)
    assert len(recent) == 2  # 4800 > 4000: offset 0 went
    assert recent.held(TOPIC, 0, CNV, [Position(1, 0)]) is None
    assert recent.held(TOPIC, 0, CNV, [Position(2, 1)]) is not None  # now the most recent
    recent.remember(TOPIC, 0, 3, record(4), 400)
    assert recent.held(TOPIC, 0, CNV, [Position(2, 1)]) is not None
    assert recent.held(TOPIC, 0, CNV, [Position(3, 2)]) is None
    recent.remember(TOPIC, 0, 9, record(9), 5000)  # larger than the whole budget: not held
    assert recent.held(TOPIC, 0, CNV, [Position(9, 9)]) is None and len(recent) == 2


def test_a_read_of_held_records_asks_no_broker_and_any_other_does() -> None:
    reader = KafkaLogReader(SETTINGS)
    fetched: list[Any] = []

    def using(fn: Any, *args: Any) -> list[Envelope]:
        fetched.append(args)
        return []

    reader._using = using  # type: ignore[method-assign]
    reader.recent.remember(TOPIC, 2, 40, record(7), 300)
    got = asyncio.run(reader.read(CONVERSATIONS, 2, CNV, [Position(7, 40)]))
    assert [e.id for e in got] == [f"{CNV}:7"] and fetched == []
    assert asyncio.run(reader.read(CONVERSATIONS, 2, CNV, [])) == []  # nothing to read
    assert fetched == []
    asyncio.run(reader.read(CONVERSATIONS, 2, CNV, [Position(7, 40), Position(8, 41)]))
    assert fetched == [(TOPIC, 2, CNV, [Position(7, 40), Position(8, 41)], 10.0)]


def test_the_worker_holds_the_log_records_its_writer_placed() -> None:
    ctx, _producer, halts = worker()
    # What its writer put on the log is held as the writer placed it (decision 0016).
    ctx.log_reader.produced(CONVERSATIONS, 3, 40, record(2), 300)
    [held] = ctx.log_reader.recent.held(TOPIC, 3, CNV, [Position(2, 40)]) or []
    assert held.id == f"{CNV}:2"
    # A record its agents consume is not held (none is an aggregate's log).
    other = event(5, record(1), topic="t.voice.workflows")
    run_agent(ctx, "staff_workflow_watch", other)
    assert halts == [] and other.acks == [5]
    assert ctx.log_reader.recent.held("t.voice.workflows", 0, CNV, [Position(1, 5)]) is None


def test_a_record_weighs_what_it_takes_decoded_its_positions_included() -> None:
    """A long conversation's ``TurnOpened`` names up to 1,000 (seq, offset) pairs: ~14 KB on
    the log, ~130 KB decoded. A budget of bytes on the log held ~9 times its size of them."""
    import datetime

    from consumers.frame.logrefs import decoded_weight
    from schemas.base import Sealed
    from schemas.conversation import TranscriptRef, TurnOpened
    from streams.envelope import decode, encode

    def opened(n: int, seq: int) -> Envelope:
        return Envelope(record=TurnOpened(
            conversation=CNV, message_id=f"m{seq}", turn=f"{CNV}:turn-{seq}",
            text=Sealed(ciphertext="x" * 400, nonce="n" * 16, key_version=1),
            at=datetime.datetime.now(datetime.UTC).isoformat(),
            history=TranscriptRef(entries=[(3 * i + 1, 50_000 + 7 * i) for i in range(n)])),
            key=CNV, source="/test", seq=seq)

    import tracemalloc
    for n in (0, 400, 1000):
        key, value, headers = encode(opened(n, 5))
        size = len(key or b"") + len(value)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = [decode(key, value, headers) for _ in range(20)]
        taken = (tracemalloc.get_traced_memory()[0] - before) / 20
        tracemalloc.stop()
        assert 0.75 * taken < decoded_weight(kept[0], size) < 1.5 * taken, (n, size, taken)
    recent = RecentRecords(budget=250_000)
    for offset, seq in ((10, 5), (20, 8)):
        recent.remember(TOPIC, 0, offset, opened(1000, seq), 14_000)
    assert len(recent) == 1, "two of ~136 KB each do not fit in 250 KB"
    assert recent.held(TOPIC, 0, CNV, [Position(8, 20)]) is not None
