"""Reading an aggregate's records back by position from the real broker: what a turn's step
does with its input's reference (``consumers.frame.logrefs.KafkaLogReader``)."""

from __future__ import annotations

import asyncio

import pytest

from consumers.frame.logrefs import SEEK_GAP, KafkaLogReader, LogUnavailable, Position
from schemas.conversation import ConversationErased
from streams.envelope import Envelope, encode
from streams.producer import RecordProducer
from streams.settings import VoiceSettings
from streams.topics import CONVERSATIONS, topic_name

pytestmark = pytest.mark.integration


async def produce(settings: VoiceSettings, envs: list[Envelope]) -> list[Position]:
    """Produce to partition 0 in order; the position of each (seq, offset)."""
    producer = RecordProducer(settings)
    try:
        topic = topic_name(settings, CONVERSATIONS)
        futs = [producer.produce_raw(topic, *encode_all(env), partition=0) for env in envs]
        msgs = await asyncio.gather(*futs)
        return [Position(env.seq or 0, m.offset()) for env, m in zip(envs, msgs, strict=True)]
    finally:
        producer.close()


def encode_all(env: Envelope) -> tuple:
    return encode(env)


def rec(key: str, seq: int) -> Envelope:
    return Envelope(record=ConversationErased(conversation=key), key=key, source="/t", seq=seq)


async def test_records_are_read_by_position_across_other_keys_and_far_gaps(
        settings: VoiceSettings) -> None:
    # Ours interleaved with another conversation's, and a gap farther than a seek.
    envs = [rec("cnv-a", 1), rec("cnv-b", 1), rec("cnv-a", 2)]
    envs += [rec("cnv-b", n) for n in range(2, SEEK_GAP + 20)]
    envs += [rec("cnv-a", 3)]
    positions = await produce(settings, envs)
    ours = [p for p, e in zip(positions, envs, strict=True) if e.key == "cnv-a"]
    reader = KafkaLogReader(settings)
    got = await reader.read(CONVERSATIONS, 0, "cnv-a", ours)
    assert [(e.key, e.seq) for e in got] == [("cnv-a", 1), ("cnv-a", 2), ("cnv-a", 3)]
    # In the order asked, not the log's.
    got = await reader.read(CONVERSATIONS, 0, "cnv-a", [ours[2], ours[0]])
    assert [e.seq for e in got] == [3, 1]

    with pytest.raises(LogUnavailable, match="holds seq 1 of 'cnv-b'") as err:
        await reader.read(CONVERSATIONS, 0, "cnv-a", [Position(2, positions[1].offset)])
    assert err.value.retryable is False
    with pytest.raises(LogUnavailable) as err:  # past the end of the log: never there
        await KafkaLogReader(settings, timeout=3).read(
            CONVERSATIONS, 0, "cnv-a", [Position(4, positions[-1].offset + 1000)])
    assert err.value.retryable is False, err.value


async def test_a_span_of_one_key_is_scanned_across_other_keys_and_repeats_kept_once(
        settings: VoiceSettings) -> None:
    # What a staff step reads instead of a copy (an issue's evidence, its followers): one
    # key's records from an offset up to a seq, another key's between, one written twice.
    envs = [rec("cnv-b", 1), rec("cnv-a", 1), rec("cnv-b", 2), rec("cnv-a", 2), rec("cnv-a", 2),
            *(rec("cnv-b", n) for n in range(3, 300)), rec("cnv-a", 3), rec("cnv-a", 4)]
    positions = await produce(settings, envs)
    start = positions[1].offset
    reader = KafkaLogReader(settings, timeout=5)
    got = await reader.scan(CONVERSATIONS, 0, "cnv-a", start, 3)
    assert [(e.key, e.seq) for e in got] == [("cnv-a", 1), ("cnv-a", 2), ("cnv-a", 3)]
    assert await reader.scan(CONVERSATIONS, 0, "cnv-a", start, 0) == []
    with pytest.raises(LogUnavailable, match="before seq 9") as err:  # never written
        await reader.scan(CONVERSATIONS, 0, "cnv-a", start, 9)
    assert err.value.retryable is False


async def test_one_reader_reuses_its_consumers_across_reads_backwards_and_at_once(
        settings: VoiceSettings) -> None:
    # A kept consumer must not hand a later read what it had fetched for an earlier one.
    envs = [rec("cnv-r", n) for n in range(1, 2 * SEEK_GAP)]
    positions = await produce(settings, envs)
    reader = KafkaLogReader(settings, pool_size=2)
    try:
        last = await reader.read(CONVERSATIONS, 0, "cnv-r", [positions[-1]])
        first = await reader.read(CONVERSATIONS, 0, "cnv-r", [positions[0]])
        assert (last[0].seq, first[0].seq) == (len(envs), 1)
        assert len(reader._idle) == 1  # the one consumer, kept and used twice

        picks = [[positions[i], positions[i + 1]] for i in range(0, len(positions) - 1, 17)]
        got = await asyncio.gather(*(reader.read(CONVERSATIONS, 0, "cnv-r", p) for p in picks))
        assert [[e.seq for e in g] for g in got] == [[p.seq for p in ps] for ps in picks]
        assert 1 <= len(reader._idle) <= 2  # at most pool_size kept

        with pytest.raises(LogUnavailable):  # a failed read closes its consumer ...
            await reader.read(CONVERSATIONS, 0, "cnv-r", [Position(1, positions[5].offset)])
        again = await reader.read(CONVERSATIONS, 0, "cnv-r", [positions[5]])  # ... and on
        assert again[0].seq == 6
    finally:
        reader.close()
    assert reader._idle == []
