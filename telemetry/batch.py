"""A batch of the telemetry sink: its records as columns, its offsets, its dedupe token, and
the dead letters it owes before its commit.

A batch belongs to one thread at a time: the sink's loop fills it, the inserter thread inserts
it, the loop sends its dead letters and commits it. It never touches Kafka or the store.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable

from confluent_kafka import TopicPartition

from streams.dead_letters import send_dead_letter
from streams.producer import RecordProducer
from streams.settings import VoiceSettings
from telemetry.envelopes import Columns
from telemetry.rows import RawRecord

DLQ_TIMEOUT_MS = 30_000
"""Longest wait for the broker to take one of the sink's dead letters (not librdkafka's
300 s: the sink does not poll meanwhile)."""


def token_of(ranges: dict[tuple[str, int], list[int]]) -> str:
    """Same records → same token: their offset ranges, hashed (tokens stay short)."""
    spec = ";".join(f"{t}:{p}:{a}-{b}" for (t, p), (a, b) in sorted(ranges.items()))
    return "voice-telemetry-" + hashlib.sha256(spec.encode()).hexdigest()[:40]


def ranges_of(cols: Columns, rows: Iterable[int]) -> dict[tuple[str, int], list[int]]:
    out: dict[tuple[str, int], list[int]] = {}
    topic, partition, offset = cols.topic, cols.partition, cols.offset
    for i in rows:
        o = offset[i]
        r = out.setdefault((topic[i], partition[i]), [o, o])
        if o < r[0]:
            r[0] = o
        elif o > r[1]:
            r[1] = o
    return out


class Batch:
    """Records taken since the last hand-over, and what settling them needs."""

    def __init__(self) -> None:
        self.cols = Columns()
        """The records, in arrival order, as ``voice.envelopes`` takes them."""
        self.started: float | None = None
        self.behind = False
        """Its first record was already older than a flush when taken: the sink is catching
        up (after a restart, an outage, a burst), not keeping pace."""
        self.drained = False
        """Catching up, a wait for records brought none: the backlog is read through (this is
        its last batch)."""
        self.dead: list[tuple[RawRecord, str]] = []
        """Records to dead-letter before the commit, with the reason."""
        self.refusals = 0
        """Inserts of this batch the store refused (answered, and said no)."""
        self.inserted = False
        self._ranges: dict[tuple[str, int], list[int]] | None = None
        """Computed once the batch is complete (it is no longer added to)."""

    @property
    def records(self) -> int:
        return len(self.cols)

    @property
    def ranges(self) -> dict[tuple[str, int], list[int]]:
        """(topic, partition) → [first, last] offset (computed once the batch is complete)."""
        if self._ranges is None:
            self._ranges = ranges_of(self.cols, range(len(self.cols)))
        return self._ranges

    def token(self) -> str:
        """Same records → same token: the batch's offset ranges, hashed (tokens stay short)."""
        return token_of(self.ranges)

    def offsets(self) -> list[TopicPartition]:
        return [TopicPartition(t, p, b + 1) for (t, p), (_a, b) in sorted(self.ranges.items())]


class DeadLetters:
    """The sink's dead letters, through the one mechanism (``streams.dead_letters``); its
    producer is made at the first one."""

    def __init__(self, settings: VoiceSettings) -> None:
        self.settings = settings
        self._producer: RecordProducer | None = None

    def send(self, raw: RawRecord, reason: str) -> None:
        """Produce ``raw`` to ``<topic>.dlq`` with ``reason``; return once the broker has it."""
        if self._producer is None:
            self._producer = RecordProducer(self.settings,
                                            **{"message.timeout.ms": DLQ_TIMEOUT_MS})
        asyncio.run(send_dead_letter(self._producer, raw.topic, raw.partition, raw.offset,
                                     raw.key, raw.value, raw.headers, reason))

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None


