"""The edge's reads of one conversation from the log (``api.frame.cold``), on the real broker:
a conversation id with a time is read from that time on, one without from the partition's
start; a stream's older seqs are read wherever they are; nothing of another key comes back."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from api.frame.cold import ColdLog
from schemas.base import Sealed
from schemas.conversation import ConversationStarted, MessageRecorded
from streams.envelope import Envelope, encode
from streams.ids import CLOCK_SLACK_MS, conversation_since_ms, new_conversation_id
from streams.producer import PRODUCER_CONFIG
from streams.settings import VoiceSettings
from streams.topics import CONVERSATIONS, partition_of, topic_name

pytestmark = pytest.mark.integration

DAY_MS = 24 * 3600 * 1000
SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")


def produce(settings: VoiceSettings, topic: str, key: str, seqs: range, at_ms: int) -> None:
    """Records ``seqs`` of conversation ``key`` (started at seq 1), stamped ``at_ms``."""
    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": settings.bootstrap})
    for seq in seqs:
        rec = (ConversationStarted(conversation=key, owner="alice") if seq == 1 else
               MessageRecorded(conversation=key, message_id=f"m{seq}", text=SEALED,
                               at="2026-01-01T00:00:00+00:00"))
        k, v, h = encode(Envelope(record=rec, key=key, source="/voice/sequencer", seq=seq,
                                  tenant="t1", subject=key))
        producer.produce(topic, v, k, headers=h, timestamp=at_ms)
    assert producer.flush(30) == 0


def test_a_timed_id_is_read_from_its_time_an_untimed_one_from_the_start(
    settings: VoiceSettings,
) -> None:
    topic = topic_name(settings, CONVERSATIONS)
    partitions = settings.topic_partitions
    now_ms = int(time.time() * 1000)
    made = (now_ms - 2 * DAY_MS) / 1000
    timed = new_conversation_id(now=made)
    since = conversation_since_ms(timed)
    assert since == int(made * 1000) - CLOCK_SLACK_MS
    untimed = "cnv-00000000000000aa"
    assert conversation_since_ms(untimed) is None
    # A stray record under the timed id from long before its time: a read that starts at
    # the id's time never sees it (no real conversation has a record older than its id).
    produce(settings, topic, timed, range(9, 10), now_ms - 30 * DAY_MS)
    produce(settings, topic, untimed, range(1, 4), now_ms - 30 * DAY_MS)
    produce(settings, topic, timed, range(1, 6), int(made * 1000) + 1000)
    produce(settings, topic, untimed, range(4, 6), now_ms - DAY_MS)

    log = ColdLog(settings)
    try:
        got = log.read_to_end(topic, partition_of(timed, partitions), timed, since)
        assert [e.seq for e in got] == [1, 2, 3, 4, 5]
        assert {e.key for e in got} == {timed}
        # Without the time it would have been read from the start: the stray one too.
        whole = log.read_to_end(topic, partition_of(timed, partitions), timed)
        assert [e.seq for e in whole] == [9, 1, 2, 3, 4, 5]
        got = log.read_to_end(topic, partition_of(untimed, partitions), untimed,
                              conversation_since_ms(untimed))
        assert [e.seq for e in got] == [1, 2, 3, 4, 5]
        # The older seqs of a stream: only those asked for, wherever they lie.
        gap = log.read_seqs(topic, partition_of(untimed, partitions), untimed, 1, 4)
        assert [e.seq for e in gap] == [2, 3, 4]
        gap = log.read_seqs(topic, partition_of(timed, partitions), timed, 0, 3, since)
        assert [e.seq for e in gap] == [1, 2, 3]
        # An id whose time is later than any record: nothing to read, no scan.
        future = new_conversation_id(now=time.time() + 86400)
        assert log.read_to_end(topic, partition_of(future, partitions), future,
                               conversation_since_ms(future)) == []
    finally:
        log.close()
