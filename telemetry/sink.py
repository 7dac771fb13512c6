"""The telemetry sink: one consumer group reads every Voice topic into ClickHouse, in batches.

Order, always: **flush batch → insert → commit offsets.**

* Each record is checked as it arrives (``telemetry.envelopes.verdict``: a valid Voice record
  or the reason it is not) and held, raw, in one columnar batch. ClickHouse does the parsing:
  a flush is one Arrow insert into ``voice.envelopes``, whose materialized views
  (``telemetry.derive``) write ``events``, ``event_blobs`` and the derived tables.
* The batch is flushed when it holds ``telemetry_batch_rows`` records or its oldest record has
  waited ``telemetry_flush_ms``, whichever comes first.
* Only after the insert (and with it every view's) succeeded does the sink commit the batch's
  offsets, synchronously (``enable.auto.commit`` is off). A crash anywhere before the
  commit means the records are read again — at least once, never lost.
* Reading again never duplicates rows. A retried insert of the same batch carries the same
  ``insert_deduplication_token`` (a hash of the batch's offset ranges), which every view's
  table drops;
  rows re-read in differently cut batches after a crash share their table's ReplacingMergeTree
  sorting key (Kafka position or event id) and collapse, and the views read with ``FINAL``.
* ClickHouse unavailable: the sink pauses every assigned partition, retries the same batch with
  exponential backoff (polling meanwhile, so it keeps its group membership), then resumes.
* An undecodable record is an ``events`` row with ``ce_type = 'undecodable'`` and the reason.
  On a topic no worker reads (acks, agent, telemetry, contributions, inbox, datasets) the sink
  is its only backend consumer, so it also sends the record to ``<topic>.dlq`` with the reason;
  on a topic a worker reads, the worker's agent does (one dead letter per record).
* A record whose rows the store refuses (not unavailable: it answers, and says no) holds no
  batch back for long: after ``VOICE_CONSUMER_RETRY_ATTEMPTS`` refusals of a batch the sink
  halves it until it finds the records refused, inserts the rest, keeps each refused one as an
  ``undecodable`` row with the store's reason, and sends it to ``<topic>.dlq`` (a record of a
  ``.dlq`` topic is counted in ``skipped`` and logged instead).

So the full order of a flush is: **insert (or isolate) → dead letters, each awaited → commit.**
A dead letter the broker does not take is retried like an unavailable store: nothing is
committed past a record that was neither stored nor dead-lettered.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, TopicPartition

from streams.dead_letters import send_dead_letter
from streams.producer import RecordProducer
from streams.retry import RetryPolicy
from streams.settings import VoiceSettings
from streams.topics import TOPICS, record_specs, topic_name
from telemetry.derive import LANDING
from telemetry.envelopes import Columns, Verdict, one, verdict
from telemetry.rows import KindCache, RawRecord
from telemetry.schema import DATABASE, ensure_schema
from telemetry.store import (
    TelemetrySettings,
    TelemetryStore,
    open_store,
    store_error,
    telemetry_settings,
    unavailable,
)

log = logging.getLogger(__name__)

TABLES = ("events", "event_blobs", "model_calls", "tool_calls", "workflow_steps")
"""The tables the sink fills: all of them through ``voice.envelopes`` and its views."""
LANDING_TABLE = f"{DATABASE}.{LANDING}"


class RowsRefused(Exception):
    """A batch holds a value its columns cannot take; the store would refuse it, so it is
    treated as the store's refusal (isolated record by record)."""


class InsertFailed(Exception):
    """``flush(max_attempts=…)`` gave up; the batch is kept and nothing was committed."""


def group_id(settings: VoiceSettings) -> str:
    return f"{settings.group_prefix}-telemetry"


def consumer_config(settings: VoiceSettings) -> dict[str, object]:
    return {
        "bootstrap.servers": settings.bootstrap,
        "group.id": group_id(settings),
        "client.id": "voice-telemetry",
        "enable.auto.commit": False,  # offsets are committed after the insert, by flush()
        "auto.offset.reset": "earliest",  # a new sink starts from the beginning of the log
        # A killed sink's partitions wait this long for a successor (the default is 45 s).
        # librdkafka heartbeats from its own thread, so a slow insert cannot trip it.
        "session.timeout.ms": 10_000,
    }


DLQ_TIMEOUT_MS = 30_000
"""Longest wait for the broker to take one of the sink's dead letters (not librdkafka's
300 s: the sink does not poll meanwhile)."""


def _token(ranges: dict[tuple[str, int], list[int]]) -> str:
    """Same records → same token: their offset ranges, hashed (tokens stay short)."""
    spec = ";".join(f"{t}:{p}:{a}-{b}" for (t, p), (a, b) in sorted(ranges.items()))
    return "voice-telemetry-" + hashlib.sha256(spec.encode()).hexdigest()[:40]


def _ranges(cols: Columns, rows: Iterable[int]) -> dict[tuple[str, int], list[int]]:
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


class _Batch:
    def __init__(self) -> None:
        self.cols = Columns()
        """The records, in arrival order, as ``voice.envelopes`` takes them."""
        self.started: float | None = None
        self.dead: list[tuple[RawRecord, str]] = []
        """Records to dead-letter before the commit, with the reason."""
        self.refusals = 0
        """Inserts of this batch the store refused (answered, and said no)."""
        self.inserted = False
        self._ranges: dict[tuple[str, int], list[int]] | None = None

    @property
    def records(self) -> int:
        return len(self.cols)

    @property
    def ranges(self) -> dict[tuple[str, int], list[int]]:
        """(topic, partition) → [first, last] offset (computed once the batch is complete)."""
        if self._ranges is None:
            self._ranges = _ranges(self.cols, range(len(self.cols)))
        return self._ranges

    def add(self, topic: str, partition: int, offset: int, key: bytes | None,
            value: bytes | None, headers: Any, kafka_ms: int | None, verdict: Verdict,
            now: float) -> None:
        self.cols.add(topic, partition, offset, key, value, headers, kafka_ms, verdict)
        self._ranges = None
        if self.started is None:
            self.started = now

    def token(self) -> str:
        """Same records → same token: the batch's offset ranges, hashed (tokens stay short)."""
        return _token(self.ranges)

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


class Sink:
    """Consumes every registered topic (and its ``.dlq``) into the telemetry store.

    Drive it with ``poll_once()`` in a loop (``run_sink`` does); ``flush()`` forces the batch
    out; ``close()`` flushes what it can and lets go of consumer and store.
    """

    def __init__(
        self,
        settings: VoiceSettings,
        store: TelemetryStore | None = None,
        consumer: Any | None = None,
        retry_initial_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        dead_letter: Callable[[RawRecord, str], None] | None = None,
    ) -> None:
        """``dead_letter(record, reason)`` replaces the Kafka dead-letter path (tests)."""
        self.settings: TelemetrySettings = telemetry_settings(settings)
        self.store = store if store is not None else open_store(self.settings)
        try:
            ensure_schema(self.store)
        except BaseException:
            if store is None:  # ours: release it (chDB allows one open folder per process)
                self.store.close()
            raise
        self._clock = clock
        self._retry_initial_s = retry_initial_s
        self._policy = RetryPolicy.from_settings(self.settings)
        self._dead_letters = DeadLetters(self.settings) if dead_letter is None else None
        self._dead_letter = dead_letter or self._dead_letters.send  # type: ignore[union-attr]
        self.sole_reader = {topic_name(self.settings, s) for s in TOPICS if not s.read_by_workers}
        """Topics no worker reads: the sink dead-letters their undecodable records."""
        self.dead_lettered = 0
        """Records this sink sent to a dead-letter topic."""
        self.skipped = 0
        """Records of a ``.dlq`` topic the store refused (logged; there is no further DLQ)."""
        self._kinds = KindCache()
        self._batch = _Batch()
        self._held: list[Any] = []  # records that arrived while a flush was retrying
        self._flushing = False
        self._lost = False  # partitions were revoked while a flush was retrying
        self._paused = False
        self._stopping = False
        self.topics = [topic_name(self.settings, s) for s in record_specs()]
        self.consumer = consumer if consumer is not None else Consumer(
            consumer_config(self.settings)
        )
        self.consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke)

    # -- consuming ---------------------------------------------------------------------------

    def poll_once(self, timeout: float = 0.1) -> int:
        """Take what arrives within ``timeout`` (less if a flush falls due); flush if due.

        Returns the number of records taken.
        """
        flush_s = self.settings.telemetry_flush_ms / 1000
        if self._batch.started is not None:
            timeout = max(0.0, min(timeout, self._batch.started + flush_s - self._clock()))
        room = max(1, min(1000, self.settings.telemetry_batch_rows - self._batch.records))
        taken = 0
        for msg in self.consumer.consume(num_messages=room, timeout=timeout):
            taken += self._take(msg)
        if self._due():
            self.flush()
        return taken

    def _due(self) -> bool:
        b = self._batch
        if b.records >= self.settings.telemetry_batch_rows:
            return True
        return b.started is not None and (
            self._clock() - b.started >= self.settings.telemetry_flush_ms / 1000
        )

    def _take(self, msg: Any) -> int:
        err = msg.error()
        if err is not None:
            # Not a record: a missing topic, a transient broker error. librdkafka recovers.
            log.warning("telemetry consumer: %s", err)
            return 0
        # The one per-record step in Python: is it a Voice record? ClickHouse parses the rest.
        topic, key, value, headers = msg.topic(), msg.key(), msg.value(), msg.headers()
        v = verdict(topic, key, value, headers, self._kinds)
        ts_type, ts = msg.timestamp()
        batch = self._batch
        batch.add(topic, msg.partition(), msg.offset(), key, value, headers,
                  ts if ts_type and ts > 0 else None, v, self._clock())
        if v.error is not None and topic in self.sole_reader:
            batch.dead.append((batch.cols.raw(batch.records - 1), f"telemetry: {v.error}"))
        return 1

    # -- flushing ----------------------------------------------------------------------------

    def flush(self, max_attempts: int | None = None) -> int:
        """Insert the batch, then commit its offsets; returns the records flushed.

        Retries the insert (the same rows with the same token) until it succeeds, the sink is
        stopping, partitions were revoked, or ``max_attempts`` is reached (``InsertFailed``).
        Only a successful insert is followed by a commit.
        """
        batch = self._batch
        if not batch.records:
            return 0
        attempt = 0
        self._flushing, self._lost = True, False
        try:
            while True:
                attempt += 1
                try:
                    self._store(batch)
                    self._send_dead_letters(batch)
                    break
                except Exception as exc:
                    if max_attempts is not None and attempt >= max_attempts:
                        raise InsertFailed(f"insert failed {attempt}x: {store_error(exc)}"
                                           ) from exc
                    delay = min(self.settings.telemetry_retry_max_s,
                                self._retry_initial_s * 2 ** (attempt - 1))
                    log.warning("telemetry flush failed (attempt %d), retrying in %.1fs: %s",
                                attempt, delay, store_error(exc))
                    self._pause()
                    self._wait(delay)
                    if self._lost or self._stopping:
                        # Uncommitted: whoever owns the partitions next reads them again.
                        log.warning("dropping an uncommitted batch of %d records (%s)",
                                    batch.records, "revoked" if self._lost else "stopping")
                        self._batch = _Batch()
                        return 0
            self._commit(batch)
            self._batch = _Batch()
        finally:
            self._flushing = False
            self._resume()
        held, self._held = self._held, []
        for msg in held:
            self._take(msg)
        return batch.records

    def _store(self, batch: _Batch) -> None:
        """Insert the batch's records (once); after repeated refusals, isolate what is
        refused."""
        if batch.inserted:
            return
        try:
            t0 = time.perf_counter()
            self._insert(batch.cols, None, batch.token())
            log.debug("inserted %d records in %.1f ms", batch.records,
                      (time.perf_counter() - t0) * 1000)
        except Exception as exc:
            if unavailable(exc):
                raise
            batch.refusals += 1
            if batch.refusals < self._policy.attempts:
                raise
            log.warning("the store refused a batch of %d records %d times (%s); finding "
                        "the records it refuses", batch.records, batch.refusals,
                        store_error(exc))
            self._isolate(batch, exc)
        batch.inserted = True

    def _isolate(self, batch: _Batch, refusal: Exception) -> None:
        """Insert the batch in halves, down to single records; each refused record is kept
        as an ``undecodable`` row with the store's reason and queued for its dead-letter
        topic. An unavailable store stops it (raised): the next attempt starts over, and the
        halves already in are deduplicated by their tokens."""
        cols = batch.cols
        refused: list[tuple[RawRecord, Exception]] = []

        def insert(rows: list[int]) -> None:
            try:
                self._insert(cols, rows, _token(_ranges(cols, rows)))
            except Exception as exc:
                if unavailable(exc):
                    raise
                if len(rows) == 1:
                    refused.append((cols.raw(rows[0]), exc))
                    return
                halve(rows)

        def halve(rows: list[int]) -> None:
            half = len(rows) // 2
            insert(rows[:half])
            insert(rows[half:])

        if batch.records > 1:
            halve(list(range(batch.records)))  # the whole batch was just refused
        else:
            refused.append((cols.raw(0), refusal))
        dead, skipped = [], 0
        for raw, exc in refused:
            reason = f"telemetry: the store refused its rows: {store_error(exc)}"
            log.error("%s[%s]@%s: %s", raw.topic, raw.partition, raw.offset, reason)
            try:  # what the analyst sees of it: the record's place, headers and the reason
                token = _token({(raw.topic, raw.partition): [raw.offset, raw.offset]})
                self.store.insert_arrow(LANDING_TABLE, one(raw, reason), token=token + "-refused")
            except Exception as fallback:
                if unavailable(fallback):
                    raise
                log.error("the store refused the fallback row of %s[%s]@%s too: %s",
                          raw.topic, raw.partition, raw.offset, store_error(fallback))
            if raw.topic.endswith(".dlq"):
                skipped += 1  # already a dead letter: the log line is its trace
            else:
                dead.append((raw, reason))
        batch.dead.extend(dead)
        self.skipped += skipped

    def _send_dead_letters(self, batch: _Batch) -> None:
        """Produce the batch's dead letters, each awaited; one that fails is raised (the
        flush retries it, and commits nothing meanwhile)."""
        while batch.dead:
            raw, reason = batch.dead[0]
            self._dead_letter(raw, reason)
            batch.dead.pop(0)
            self.dead_lettered += 1
            log.warning("dead-lettered %s[%s]@%s: %s", raw.topic, raw.partition, raw.offset,
                        reason)

    def _insert(self, cols: Columns, rows: list[int] | None, token: str) -> None:
        """One insert into ``voice.envelopes``; its views write every table in the same call."""
        try:
            data = cols.arrow(rows)
        except (pa.ArrowException, OverflowError) as exc:
            # A value no column can hold (a seq past Int64): the store's refusal, found early.
            raise RowsRefused(f"{type(exc).__name__}: a value does not fit its column") from exc
        self.store.insert_arrow(LANDING_TABLE, data, token=token)

    def _commit(self, batch: _Batch) -> None:
        try:
            self.consumer.commit(offsets=batch.offsets(), asynchronous=False)
        except KafkaException as exc:
            # The rows are in; a rebalance may have moved the partitions. The next owner
            # re-reads from the last commit, and the dedupe keeps the rows single.
            log.warning("committing telemetry offsets failed (rows are inserted): %s", exc)

    def _pause(self) -> None:
        if not self._paused:
            assignment = self.consumer.assignment()
            if assignment:
                self.consumer.pause(assignment)
            self._paused = True

    def _resume(self) -> None:
        if self._paused:
            assignment = self.consumer.assignment()
            if assignment:
                self.consumer.resume(assignment)
            self._paused = False

    def _wait(self, seconds: float) -> None:
        # Poll rather than sleep: paused partitions deliver nothing, but polling serves
        # rebalances and keeps max.poll.interval.ms satisfied through a long outage.
        deadline = self._clock() + seconds
        while not self._stopping and not self._lost:
            left = deadline - self._clock()
            if left <= 0:
                return
            self._held.extend(self.consumer.consume(num_messages=100, timeout=min(0.5, left)))

    # -- rebalances --------------------------------------------------------------------------

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if self._paused and partitions:
            consumer.pause(partitions)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if self._flushing:
            self._lost = True  # flush() is retrying further up this stack; it drops the batch
        elif self._batch.records:
            try:
                self.flush(max_attempts=1)  # commit what we have while we still own it
            except InsertFailed as exc:
                log.warning("dropping an uncommitted batch on revoke: %s", exc)
                self._batch = _Batch()
        self._held.clear()  # they belong to the revoked assignment and will be read again
        self._resume()  # librdkafka may keep a partition's pause across a rebalance

    # -- lifecycle ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask the loop and any retrying flush to end (safe from a signal handler)."""
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    def close(self, flush: bool = True) -> None:
        """Flush what can be flushed (a few attempts), then close consumer and store."""
        try:
            if flush and self._batch.records:
                was, self._stopping = self._stopping, False
                try:
                    self.flush(max_attempts=3)
                except InsertFailed as exc:
                    log.warning("closing with an unflushed batch (it will be re-read): %s", exc)
                finally:
                    self._stopping = was
        finally:
            # What is left is uncommitted and will be re-read; the revoke that closing the
            # consumer triggers must not try to flush it again.
            self._batch = _Batch()
            self._stopping = True
            try:
                self.consumer.close()
            finally:
                if self._dead_letters is not None:
                    self._dead_letters.close()
                self.store.close()


def run_sink(settings: VoiceSettings) -> int:
    """Run the telemetry sink until SIGTERM or SIGINT; returns the exit status.

    With the embedded store it also serves the read-only SQL endpoint ``voice sql`` uses
    (``POST 127.0.0.1:VOICE_TELEMETRY_QUERY_PORT/query``, with a token granting
    ``telemetry.query``), since no other process can open the folder.
    """
    from telemetry.endpoint import QueryServer

    ts = telemetry_settings(settings)
    stop = {"now": False}
    sink: Sink | None = None

    def on_signal(signum: int, _frame: object) -> None:
        stop["now"] = True
        if sink is not None:
            sink.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    delay = 0.5
    while sink is None and not stop["now"]:
        try:
            sink = Sink(ts)
        except Exception as exc:  # a server not up yet: wait for it rather than crash-loop
            log.warning("telemetry store not ready, retrying in %.1fs: %s", delay, exc)
            time.sleep(delay)
            delay = min(delay * 2, ts.telemetry_retry_max_s)
    if sink is None:
        return 0
    server = None
    if not ts.clickhouse_url and ts.telemetry_query_port:
        server = QueryServer(ts, open_store(ts, readonly=True))
        server.start()
    log.info("telemetry sink: group %s, %d topics, store %s", group_id(ts), len(sink.topics),
             sink.store.location)
    try:
        while not sink.stopping and not stop["now"]:
            sink.poll_once(timeout=0.5)
    finally:
        if server is not None:
            server.stop()
        sink.close()
    return 0
