"""Reading one aggregate's records from the log on demand, by key.

An edge started with ``VOICE_EDGE_HISTORY_S`` reads its logs only from that far back
(``api.frame.tail``) and keeps only conversations in use; one it does not hold is read here
when a request asks for it (decision 0011). Kafka has no index by key, so this reads the key's
one partition (``streams.topics.partition_of``) from its start up to the end it has when the
read begins — from the time in its id (``streams.ids.conversation_since_ms``) when it has
one — and keeps the key's records — a scan of one partition's history, paid once per
cold aggregate and never on the event loop (callers run it in a thread). The same scan serves
a stream's cursor older than the events kept in memory (``read_seqs``).

It never writes, never commits (no group: ``assign`` only), and skips what it cannot decode,
as the tail does (the writer side dead-letters it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, TopicPartition

from api.frame.tail import EdgeTail
from streams.envelope import DecodeError, Envelope, decode
from streams.fetch import READING, take
from streams.ids import conversation_since_ms
from streams.settings import VoiceSettings
from streams.topics import partition_of

log = logging.getLogger(__name__)

BATCH = 2000
"""Records taken from the client per call while scanning."""
PREFETCH_KIB = 4096
"""The scan consumer's prefetch buffer (librdkafka's default is 64 MiB)."""
SCAN_TIMEOUT_S = 60.0
"""A scan that has not reached its end offset by then fails (the caller answers 503)."""


Position = Callable[[Envelope], int | None]
"""A record's position in its stream (a stream's cursor), None for a record of no position."""


def seq_of(env: Envelope) -> int | None:
    """A conversation's position: the record's seq."""
    return env.seq


class ColdReadFailed(Exception):
    """The partition could not be read to the offset asked for in time (retryable)."""


class ColdLog:
    """Reads one key's records below a given offset, one scan at a time, with one consumer
    kept for every scan (connecting costs more than a small scan; one buffer, reused)."""

    def __init__(self, settings: VoiceSettings) -> None:
        self.settings = settings
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer({
                "bootstrap.servers": self.settings.bootstrap,
                "group.id": f"{self.settings.group_prefix}-edge-cold-unused",  # assign() only
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # A scan reads through history once: a small prefetch buffer is enough.
                "queued.max.messages.kbytes": PREFETCH_KIB,
                **READING,  # so a full prefetch buffer costs ~10 ms, not a second
                # A fetch at a partition's end waits this long on the broker, and the next
                # scan's first fetch waits behind it (500 ms by default, paid by every read
                # after the first); a scan's client is unassigned between scans, so it is
                # never polling an idle partition.
                "fetch.wait.max.ms": 10,
            })
        return self._consumer

    def read_to_end(self, topic: str, partition: int, key: str, since_ms: int | None = None,
                    timeout: float = SCAN_TIMEOUT_S) -> list[Envelope]:
        """Every decodable record of ``key`` in ``topic[partition]``, up to the end the
        partition has when the read begins, in log order (blocking: call it in a thread).
        ``since_ms``: no record of ``key`` is older (its id says so), so the scan starts at
        the first offset of that time, not at the partition's start."""
        return self._read(topic, partition, key, since_ms, timeout)

    def read_seqs(self, topic: str, partition: int, key: str, after: int, upto: int,
                  since_ms: int | None = None, timeout: float = SCAN_TIMEOUT_S,
                  position: Position = seq_of) -> list[Envelope]:
        """The records of ``key`` in ``topic[partition]`` whose position (``position``: its
        seq, unless told otherwise) is in ``(after, upto]``, in log order: the events a resumed
        stream needs from before what the edge keeps (blocking: call it in a thread; scans
        wait for each other). Reads from the partition's start (or ``since_ms``) until the
        record at ``upto`` (or the end the partition had when the scan began)."""
        if upto <= after:
            return []

        def stop(env: Envelope) -> bool:
            at = position(env)
            return at is not None and at >= upto

        found = self._read(topic, partition, key, since_ms, timeout, stop=stop)
        return [env for env in found
                if (at := position(env)) is not None and after < at <= upto]

    def _read(self, topic: str, partition: int, key: str, since_ms: int | None,
              timeout: float, stop: Callable[[Envelope], bool] = lambda _env: False
              ) -> list[Envelope]:
        """One scan, on the kept client (scans wait for each other)."""
        with self._lock:
            consumer = self._client()
            try:
                return _scan(consumer, topic, partition, key.encode(), timeout, stop=stop,
                             since_ms=since_ms)
            finally:
                consumer.unassign()

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def _scan(consumer: Consumer, topic: str, partition: int, wanted: bytes, timeout: float,
          stop: Callable[[Envelope], bool], since_ms: int | None) -> list[Envelope]:
    """``wanted``'s decodable records up to the end the partition has now, from the first
    offset of ``since_ms`` (the partition's start when None), in log order, up to and
    including the first one ``stop`` says ends the scan."""
    out: list[Envelope] = []
    deadline = time.monotonic() + timeout
    low, end = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
    if since_ms is not None:
        (found,) = consumer.offsets_for_times([TopicPartition(topic, partition, since_ms)], 10)
        if found.error is not None:
            raise ColdReadFailed(f"{topic}[{partition}]: no offset by time: {found.error}")
        # -1: no record that recent, so none of ``wanted`` (which is no older) is there.
        low = end if found.offset < 0 else max(low, found.offset)
    if low >= end:
        return []
    consumer.assign([TopicPartition(topic, partition, low)])
    position = low
    while position < end:
        if time.monotonic() > deadline:
            raise ColdReadFailed(f"{topic}[{partition}] not read to offset {end} in "
                                 f"{timeout:g} s (at {position})")
        # ``take``, not ``consume(n, …)``: offsets without a record (a transaction's marker,
        # a compacted record) would have it wait out its timeout for records never coming.
        for msg in take(consumer, 0.5, BATCH):
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    position = end  # nothing more is there (end past a gap): done
                continue  # else a transient error: poll again
            offset = msg.offset()
            position = offset + 1
            if offset >= end:
                break
            if msg.key() != wanted:
                continue
            try:
                env = decode(msg.key(), msg.value(), msg.headers())
            except DecodeError as exc:
                log.info("edge cold read skips %s[%s]@%s: %s", topic, partition, offset,
                         exc.reason)
                continue
            out.append(env)
            if stop(env):
                return out
    return out


def conversation_reader(log_: ColdLog, tail: EdgeTail) -> Callable[[str], list[Envelope]]:
    """A blocking reader of one conversation's records, from its partition's start (or its
    id's time) to the end it has when the read begins (the tail brings what comes after)."""
    return key_reader(log_, tail, tail.conv_topic, conversation_since_ms)


def key_reader(log_: ColdLog, tail: EdgeTail, topic: str,
               since_of: Callable[[str], int | None]) -> Callable[[str], list[Envelope]]:
    """A blocking reader of one key's records on ``topic`` (one the tail reads), from the time
    ``since_of`` gives for the key to the end the partition has when the read begins."""

    def read(key: str) -> list[Envelope]:
        if not tail.assigned.wait(SCAN_TIMEOUT_S):
            raise ColdReadFailed("the edge's tail is not assigned yet")
        partition = partition_of(key, tail.partitions[topic])
        return log_.read_to_end(topic, partition, key, since_of(key))

    return read


def conversation_gap_reader(log_: ColdLog, tail: EdgeTail
                            ) -> Callable[..., list[Envelope]]:
    """A blocking reader of one conversation's records with seq in ``(after, upto]``, from
    anywhere in its partition: what a cursor older than the edge keeps needs (decision 0011,
    step 5)."""
    return gap_reader(log_, tail, tail.conv_topic, seq_of)


def gap_reader(log_: ColdLog, tail: EdgeTail, topic: str, position: Position
               ) -> Callable[..., list[Envelope]]:
    """A blocking reader of one conversation's records on ``topic`` (one the tail reads) at
    positions in ``(after, upto]``, from its id's time (or a later ``since_ms`` the caller
    knows no record of them is older than) to the end its partition has when the read
    begins."""

    def read(key: str, after: int, upto: int, since_ms: int | None = None) -> list[Envelope]:
        if not tail.assigned.wait(SCAN_TIMEOUT_S):
            raise ColdReadFailed("the edge's tail is not assigned yet")
        partition = partition_of(key, tail.partitions[topic])
        start = conversation_since_ms(key)
        if since_ms is not None:  # a later start the caller knows (no record is older)
            start = since_ms if start is None else max(start, since_ms)
        return log_.read_seqs(topic, partition, key, after, upto, start, position=position)

    return read
