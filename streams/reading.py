"""Reading a topic back from its beginning up to its current end (replay, tests, benchmarks).

Never used on a request path: it scans whole partitions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from streams.fetch import READING, take
from streams.settings import VoiceSettings

BATCH = 1000
"""Records taken from the client at a time."""


def read_topic(settings: VoiceSettings, topic: str, key: bytes | None = None,
               timeout: float = 30.0) -> list[Any]:
    """Every record now on ``topic`` (all partitions; only ``key``'s when given), in offset
    order per partition. Returns confluent-kafka ``Message`` objects."""
    return [msg for batch in read_batches(settings, topic, timeout) for msg in batch
            if key is None or msg.key() == key]


def read_batches(settings: VoiceSettings, topic: str, timeout: float = 30.0
                 ) -> Iterator[list[Any]]:
    """Every record now on ``topic`` (all partitions; and any that came meanwhile in the same
    fetch), a batch of up to ``BATCH`` at a time, in offset order per partition: a whole topic
    without holding it all. ``TimeoutError``
    when it is not read to its end in ``timeout`` s."""
    c = Consumer({"bootstrap.servers": settings.bootstrap,
                  "group.id": f"voice-read-{uuid.uuid4().hex}", "enable.auto.commit": False,
                  **READING})
    try:
        md = c.list_topics(topic, timeout=10)
        if topic not in md.topics or md.topics[topic].error is not None:
            raise LookupError(f"topic {topic!r} does not exist")
        parts = list(md.topics[topic].partitions)
        ends = {p: end_offset(c, TopicPartition(topic, p), timeout) for p in parts}
        todo = {p for p in parts if ends[p] > 0}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            batch = []
            for msg in take(c, 0.2, BATCH):
                if msg.error():
                    continue
                batch.append(msg)
                if msg.offset() + 1 >= ends[msg.partition()]:
                    todo.discard(msg.partition())
            if batch:
                yield batch
        if todo:
            raise TimeoutError(f"could not read {topic!r} to its end in {timeout}s")
    finally:
        c.close()


_MOMENTARY = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TIMED_OUT, KafkaError._TRANSPORT}


def end_offset(c: Consumer, tp: TopicPartition, timeout: float) -> int:
    """The partition's high watermark. Right after a topic is created (or while a leader
    moves) the broker answers ``NOT_LEADER_FOR_PARTITION`` and the like for a moment: those
    retriable answers are asked again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(c.get_watermark_offsets(tp, 10)[1])
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            if code not in _MOMENTARY or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
