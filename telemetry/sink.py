"""The telemetry sink: one consumer group reads every Voice topic into ClickHouse, in batches.

Order, always: **flush batch → insert → commit offsets.**

* Records are mapped to rows (``telemetry.rows``) as they arrive and held in one batch.
* The batch is flushed when it holds ``telemetry_batch_rows`` records or its oldest record has
  waited ``telemetry_flush_ms``, whichever comes first.
* A flush inserts every table's rows; only after every insert succeeded does the sink commit
  the batch's offsets, synchronously (``enable.auto.commit`` is off). A crash anywhere before the
  commit means the records are read again — at least once, never lost.
* Reading again never duplicates rows. A retried insert of the same batch carries the same
  ``insert_deduplication_token`` (a hash of the batch's offset ranges), which the engine drops;
  rows re-read in differently cut batches after a crash share their table's ReplacingMergeTree
  sorting key (Kafka position or event id) and collapse, and the views read with ``FINAL``.
* ClickHouse unavailable: the sink pauses every assigned partition, retries the same batch with
  exponential backoff (polling meanwhile, so it keeps its group membership), then resumes.
* An undecodable record is an ``events`` row with ``ce_type = 'undecodable'`` and the reason.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from streams.settings import VoiceSettings
from streams.topics import all_specs, topic_name
from telemetry.rows import KindCache, RawRecord, Rows, map_record
from telemetry.schema import DATABASE, column_names, ensure_schema
from telemetry.store import TelemetrySettings, TelemetryStore, open_store, telemetry_settings

log = logging.getLogger(__name__)

# Tables in insert order; events first so a partial failure leaves the raw log most complete.
TABLES = ("events", "event_blobs", "model_calls", "tool_calls", "workflow_steps")


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


class _Batch:
    def __init__(self) -> None:
        self.rows = Rows()
        self.records = 0
        self.ranges: dict[tuple[str, int], list[int]] = {}  # (topic, partition) → [first, last]
        self.started: float | None = None

    def add(self, raw: RawRecord, rows: Rows, now: float) -> None:
        self.rows.extend(rows)
        self.records += 1
        r = self.ranges.setdefault((raw.topic, raw.partition), [raw.offset, raw.offset])
        r[0], r[1] = min(r[0], raw.offset), max(r[1], raw.offset)
        if self.started is None:
            self.started = now

    def token(self) -> str:
        """Same records → same token: the batch's offset ranges, hashed (tokens stay short)."""
        spec = ";".join(f"{t}:{p}:{a}-{b}" for (t, p), (a, b) in sorted(self.ranges.items()))
        return "voice-telemetry-" + hashlib.sha256(spec.encode()).hexdigest()[:40]

    def offsets(self) -> list[TopicPartition]:
        return [TopicPartition(t, p, b + 1) for (t, p), (_a, b) in sorted(self.ranges.items())]


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
    ) -> None:
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
        self._kinds = KindCache()
        self._batch = _Batch()
        self._held: list[Any] = []  # records that arrived while a flush was retrying
        self._flushing = False
        self._lost = False  # partitions were revoked while a flush was retrying
        self._paused = False
        self._stopping = False
        self.topics = [topic_name(self.settings, s) for s in all_specs()]
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
        raw = RawRecord.from_message(msg)
        self._batch.add(raw, map_record(raw, self._kinds), self._clock())
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
        token, attempt = batch.token(), 0
        self._flushing, self._lost = True, False
        try:
            while True:
                attempt += 1
                try:
                    t0 = time.perf_counter()
                    self._insert(batch.rows, token)
                    log.debug("inserted %d records in %.1f ms", batch.records,
                              (time.perf_counter() - t0) * 1000)
                    break
                except Exception as exc:
                    if max_attempts is not None and attempt >= max_attempts:
                        raise InsertFailed(f"insert failed {attempt}x: {exc}") from exc
                    delay = min(self.settings.telemetry_retry_max_s,
                                self._retry_initial_s * 2 ** (attempt - 1))
                    log.warning("telemetry insert failed (attempt %d), retrying in %.1fs: %s",
                                attempt, delay, exc)
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

    def _insert(self, rows: Rows, token: str) -> None:
        for table in TABLES:
            data = rows.tables.get(table)
            if data:
                self.store.insert(f"{DATABASE}.{table}", column_names(table), data, token=token)

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
