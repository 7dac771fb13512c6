"""The changelog partitions Faust holds paused are paused in aiokafka too (issue 14, fifth pass).

Drives the real Faust consumer of a ``VoiceApp`` (not started) whose consumer thread's loop runs
in a thread, as in a worker, with an aiokafka stand-in that keeps an assignment and a paused set
the way ``AIOKafkaConsumer`` does (pausing a partition not assigned is an error there).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from faust.types import TP

from consumers.frame.changelog_fetch import changelogs_to_pause
from consumers.frame.handover import VoiceApp

STREAM = "t.voice.conversations"
OWN = "t-worker-conversations-changelog"
OTHER = "t-worker-workflows-changelog"


class Kafka:
    """``AIOKafkaConsumer``'s assignment, ``paused``, ``pause`` and ``resume``."""

    def __init__(self, assigned: set[TP]) -> None:
        self.assigned = set(assigned)
        self._paused: set[TP] = set()
        self.calls: list[tuple[str, set[TP]]] = []

    def assignment(self) -> set[TP]:
        return set(self.assigned)

    def paused(self) -> set[TP]:
        return set(self._paused)

    def pause(self, *tps: TP) -> None:
        assert set(tps) <= self.assigned, "aiokafka refuses a partition not assigned"
        self.calls.append(("pause", set(tps)))
        self._paused |= set(tps)

    def resume(self, *tps: TP) -> None:
        assert set(tps) <= self.assigned, "aiokafka refuses a partition not assigned"
        self.calls.append(("resume", set(tps)))
        self._paused -= set(tps)


@pytest.fixture
def worker() -> Iterator[tuple[Any, Kafka, asyncio.AbstractEventLoop]]:
    app = VoiceApp("changelog-fetch-test", broker="kafka://127.0.0.1:1", store="memory://",
                   web_enabled=False)
    app.tables._changelogs.update({OWN: object(), OTHER: object()})
    consumer = app.consumer
    assigned = {TP(STREAM, p) for p in range(2)} | {TP(OWN, p) for p in range(2)} \
        | {TP(OTHER, p) for p in range(2)}
    kafka = Kafka(assigned)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    consumer._thread.thread_loop = loop
    consumer._thread._consumer = kafka
    yield consumer, kafka, loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def settled(loop: asyncio.AbstractEventLoop) -> None:
    """Wait until what was queued on the consumer's loop has run."""
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)


def test_changelogs_faust_pauses_are_paused_in_aiokafka_and_streams_are_not(worker: Any) -> None:
    consumer, kafka, loop = worker
    everything = kafka.assignment()
    consumer.pause_partitions(everything)  # as at a rebalance: Faust pauses all it was given
    settled(loop)
    assert kafka.paused() == {TP(OWN, 0), TP(OWN, 1), TP(OTHER, 0), TP(OTHER, 1)}
    assert not any(tp.topic == STREAM for _, tps in kafka.calls for tp in tps)


def test_recovery_resumes_what_it_reads_and_the_pause_after_it_stops_the_fetch(
        worker: Any) -> None:
    consumer, kafka, loop = worker
    consumer.pause_partitions(kafka.assignment())
    consumer.resume_partitions({TP(OWN, 0), TP(OWN, 1)})  # recovery reads its actives
    settled(loop)
    assert kafka.paused() == {TP(OTHER, 0), TP(OTHER, 1)}
    consumer.pause_partitions({TP(OWN, 0), TP(OWN, 1)})  # recovered
    consumer.resume_partitions({TP(OTHER, 1)})  # a standby: read on
    consumer.resume_partitions({TP(STREAM, 0), TP(STREAM, 1)})  # the streams go
    settled(loop)
    assert kafka.paused() == {TP(OWN, 0), TP(OWN, 1), TP(OTHER, 0)}


def test_partitions_no_longer_assigned_are_never_named(worker: Any) -> None:
    consumer, kafka, loop = worker
    consumer.pause_partitions(kafka.assignment())
    settled(loop)
    kafka.assigned -= {TP(OWN, 1)}  # revoked in aiokafka before Faust's books caught up
    kafka._paused -= {TP(OWN, 1)}
    consumer.resume_partitions({TP(OWN, 0)})
    consumer.pause_partitions({TP(OWN, 0), TP(OWN, 1)})
    settled(loop)
    assert kafka.paused() == {TP(OWN, 0), TP(OTHER, 0), TP(OTHER, 1)}


def test_a_consumer_not_started_is_left_alone() -> None:
    app = VoiceApp("changelog-fetch-test-2", broker="kafka://127.0.0.1:1", store="memory://",
                   web_enabled=False)
    app.consumer.pause_partitions({TP(STREAM, 0)})  # no aiokafka consumer yet: nothing to do
    assert TP(STREAM, 0) in app.consumer._paused_partitions


def test_the_plan_names_only_changelogs_and_only_assigned_ones() -> None:
    a, b, s = TP(OWN, 0), TP(OWN, 1), TP(STREAM, 0)
    assert changelogs_to_pause({a, s}, {a, b, s}, set(), {OWN}) == ({a}, set())
    assert changelogs_to_pause({a, b, s}, {s}, {a, b, s}, {OWN}) == (set(), {a, b})
    assert changelogs_to_pause({a}, {a}, {a, b}, {OWN}) == (set(), set())


def test_a_consumer_whose_loop_is_closed_is_left_alone(worker: Any) -> None:
    """A worker stopping: Faust may still pause what it had, after the thread's loop closed."""
    consumer, kafka, loop = worker
    closed = asyncio.new_event_loop()
    closed.close()
    consumer._thread.thread_loop = closed
    consumer.pause_partitions(kafka.assignment())  # no RuntimeError from the closed loop
    assert TP(OWN, 0) in consumer._paused_partitions and kafka.paused() == set()
