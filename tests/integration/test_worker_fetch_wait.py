"""The stall behind ``VOICE_WORKER_FETCH_WAIT_MS`` (issue 14, thirty-eighth pass), on the real
broker, with the aiokafka consumer a worker's Faust app makes.

aiokafka leaves out of its next fetch a partition whose fetched records still wait to be
taken; once they are taken, that partition's next record waits for the fetch in flight — up to
the broker's whole wait when nothing lands on that fetch's partitions. With Faust's 1,500 ms a
record came ~1.3 s late; with the worker's wait, within it."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import TopicPartition
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from consumers.frame.handover import VoiceApp
from streams.settings import VoiceSettings

pytestmark = pytest.mark.integration


def _topic(bootstrap: str) -> str:
    name = f"fetch-wait-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    return name


def _produce(producer: Producer, topic: str, partition: int) -> None:
    producer.produce(topic, b"x", partition=partition)
    assert producer.flush(10) == 0


async def _late_by(bootstrap: str, fetch_wait_ms: int | None) -> float:
    """Seconds from a record's ack to its arrival, for a partition whose previous record was
    taken after the next fetch (of the other partition alone) had gone out."""
    topic = _topic(bootstrap)
    app = VoiceApp(f"fetch-wait-{uuid.uuid4().hex[:6]}", broker=f"kafka://{bootstrap}",
                   store="memory://", web_enabled=False, fetch_wait_ms=fetch_wait_ms)
    kafka = app.consumer._thread._create_worker_consumer(app.transport)
    producer = Producer({"bootstrap.servers": bootstrap})
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    await kafka.start()
    try:
        kafka.assign([tp0, tp1])
        await kafka.seek_to_end(tp0, tp1)
        await kafka.position(tp0)
        await kafka.position(tp1)
        _produce(producer, topic, 0)
        # Not taken for longer than aiokafka's prefetch backoff (0.1 s): the next fetch goes
        # out for partition 1 alone, and the broker holds it (nothing lands there).
        await asyncio.sleep(0.4)
        first = await kafka.getmany(tp0, timeout_ms=5000)
        assert sum(len(v) for v in first.values()) == 1
        _produce(producer, topic, 0)
        acked = time.monotonic()
        second = await kafka.getmany(tp0, timeout_ms=5000)
        assert sum(len(v) for v in second.values()) == 1
        return time.monotonic() - acked
    finally:
        await kafka.stop()


async def test_a_partition_taken_late_waits_for_the_fetch_in_flight_at_most_the_wait(
        settings: VoiceSettings) -> None:
    fausts = await _late_by(settings.bootstrap, None)
    ours = await _late_by(settings.bootstrap, 100)
    assert fausts > 0.8, f"Faust's 1,500 ms wait: the record came {fausts:.2f} s late"
    assert ours < 0.5, f"a 100 ms wait: the record came {ours:.2f} s late"
