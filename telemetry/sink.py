"""The telemetry sink: one consumer group reads every Voice topic into ClickHouse, in batches.

Order, always: **flush batch → insert → commit offsets.**

* Each record is checked as it arrives (``telemetry.envelopes.verdict``: a valid Voice record
  or the reason it is not) and held, raw, in one columnar batch. ClickHouse does the parsing:
  a flush is one Arrow insert into ``voice.envelopes``, whose materialized views
  (``telemetry.derive``) write ``events``, ``event_blobs`` and the derived tables.
* The batch is handed to the inserter thread when it holds ``telemetry_batch_rows`` records,
  or when its oldest record has waited ``telemetry_flush_ms`` and the inserter is free (while
  it inserts the batch before, this one keeps growing); catching up through a backlog, as soon
  as it holds ``telemetry_eager_rows`` (or the backlog is read through) and the inserter is
  free. Records are taken and checked while the previous batch is inserted; that batch is
  settled — its dead letters sent, its offsets committed — before the next is handed over.
* Only after the insert (and with it every view's) succeeded does the sink commit the batch's
  offsets, in the sink's loop, synchronously (``enable.auto.commit`` is off). A crash anywhere
  before the commit means the records are read again — at least once, never lost.
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

import logging
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, TopicPartition

from streams.fetch import READING, take
from streams.heap import settle_heap
from streams.retry import RetryPolicy
from streams.settings import VoiceSettings
from streams.topics import TOPICS, record_specs, topic_name
from telemetry.batch import Batch, DeadLetters, ranges_of, token_of
from telemetry.derive import LANDING
from telemetry.envelopes import Columns, one
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


BUSY_POLL_S = 0.02
"""How often an overdue batch looks whether the inserter is free (at most this is added to its
wait)."""


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
        **READING,  # catching up a backlog, a full queue costs ~10 ms, not a second
    }


class Sink:
    """Consumes every registered topic (and its ``.dlq``) into the telemetry store.

    Drive it with ``poll_once()`` in a loop (``run_sink`` does); ``flush()`` forces every
    batch out; ``close()`` flushes what it can and lets go of consumer and store.
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
        self._batch = Batch()
        """The batch being filled."""
        self._pending: Batch | None = None
        """The batch handed over: being inserted, or inserted and not yet committed."""
        self._future: Future[None] | None = None
        """The inserter thread's insert of ``_pending``, until the loop collects it."""
        self._inserter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="telemetry-insert")
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
        # pyarrow builds its conversions on first use (~0.3 s): pay it now, not in the first
        # batch's latency.
        Columns().arrow()

    # -- consuming ---------------------------------------------------------------------------

    def poll_once(self, timeout: float = 0.1) -> int:
        """Take what arrives within ``timeout`` (less if a flush falls due); hand the batch to
        the inserter if it is due; settle the batch the inserter finished.

        Returns the number of records taken.
        """
        if self._future is not None and self._future.done():
            self._settle_pending(None)
        flush_s = self.settings.telemetry_flush_ms / 1000
        b = self._batch
        if b.started is not None:
            left = b.started + flush_s - self._clock()
            if left > 0 and not self._eager(b):
                # Catching up, a short wait finds the backlog's end (``drained``) soon.
                catching_up = b.behind and self.settings.telemetry_eager_rows > 0
                timeout = min(timeout, left, BUSY_POLL_S if catching_up else timeout)
            else:  # due, or due once the inserter is free: take what is there, look again soon
                timeout = min(timeout, BUSY_POLL_S) if self._busy() else 0.0
        room = max(1, min(1000, self.settings.telemetry_batch_rows - b.records))
        if b.started is None:
            # Nothing waits yet: the first record starts its batch's age as it comes, not
            # once ``consume`` has waited out ``timeout`` (``take``) — that wait was up to
            # half a second more of every record's lag (docs/benchmarks.md, fifth pass).
            msgs = take(self.consumer, timeout, room)
        else:  # a batch fills until it is due: waiting for more is the point
            msgs = self.consumer.consume(num_messages=room, timeout=timeout)
            # Catching up, and a wait brought nothing: the backlog is read through, and its
            # last batch goes when the inserter is free, not a flush after its first record.
            if msgs or timeout > 0:
                b.drained = b.behind and not msgs
        taken = self._take(msgs)
        if self._due():
            self._hand_over()
        return taken

    def _busy(self) -> bool:
        return self._future is not None and not self._future.done()

    def _due(self) -> bool:
        """Full; or old enough and the inserter free. A batch that comes of age while the
        inserter works keeps growing (up to full): the faster records come, the larger each
        insert, whose fixed cost (~40 ms of ClickHouse for the five views) is then spread.

        Catching up (the batch began with a record older than a flush), a batch goes as soon
        as it holds ``telemetry_eager_rows`` and the inserter is free: through a backlog the
        inserter never idles while the loop fills a batch (and the batches then size
        themselves to the insert's pace), and so does the backlog's last batch, however
        small, once a wait for records brought none (``drained``): it waited a flush for its
        age before. Keeping pace, it waits for its age: smaller inserts would only add fixed
        costs."""
        b = self._batch
        if b.records >= self.settings.telemetry_batch_rows:
            return True
        if b.started is None or self._busy():
            return False
        return (self._eager(b)
                or self._clock() - b.started >= self.settings.telemetry_flush_ms / 1000)

    def _eager(self, b: Batch) -> bool:
        """Catching up, ``b`` goes without waiting for its age: it holds
        ``telemetry_eager_rows``, or the backlog is read through (``drained``)."""
        eager = self.settings.telemetry_eager_rows
        return b.behind and 0 < eager and (eager <= b.records or b.drained)

    def _take(self, msgs: list[Any]) -> int:
        """Check each record and add it, raw, to the batch; returns the records taken."""
        if not msgs:
            return 0
        records = [m for m in msgs if m.error() is None]
        if len(records) < len(msgs):
            for m in msgs:
                if m.error() is not None:
                    # Not a record: a missing topic, a transient broker error. librdkafka
                    # recovers.
                    log.warning("telemetry consumer: %s", m.error())
            if not records:
                return 0
        batch = self._batch
        if batch.started is None:
            batch.started = self._clock()
            ts_type, ts = records[0].timestamp()
            batch.behind = bool(ts_type) and (
                ts < time.time() * 1000 - self.settings.telemetry_flush_ms)
        # The one per-record step in Python: is it a Voice record? ClickHouse parses the rest.
        cols = batch.cols
        for row in cols.add_messages(records, self._kinds):
            if cols.topic[row] in self.sole_reader:
                batch.dead.append((cols.raw(row), f"telemetry: {cols.decode_error[row]}"))
        return len(records)

    # -- flushing ----------------------------------------------------------------------------
    #
    # Two batches at most: the one being filled (``_batch``) and the one handed over
    # (``_pending``), which the inserter thread inserts meanwhile (``_future``; chDB and the
    # HTTP client both release the GIL while ClickHouse works). The pending batch is settled —
    # inserted, dead letters sent, offsets committed — before the next is handed over, so
    # commits follow inserts and go forward in order. Should a pending batch be dropped
    # (stopping, or its partitions revoked while it waited for the store), the batch behind it
    # is dropped too: committing it would commit past records that were never stored.

    def _hand_over(self) -> None:
        """Settle the pending batch (waiting for its insert), then start inserting this one."""
        if self._pending is not None and not self._settle_pending(None):
            return  # dropped, and the batch being filled with it
        batch, self._batch = self._batch, Batch()
        self._pending, self._future = batch, self._inserter.submit(self._store, batch)

    def flush(self, max_attempts: int | None = None) -> int:
        """Settle the pending batch, then insert and commit the one being filled; returns the
        records committed.

        Retries an insert (the same rows with the same token) until it succeeds, the sink is
        stopping, partitions were revoked (both drop every uncommitted batch: 0 is returned),
        or ``max_attempts`` is reached (``InsertFailed``: the batches are kept, nothing more
        is committed). Only a successful insert is followed by a commit.
        """
        done = 0
        while True:
            if self._pending is not None:
                pending = self._pending
                if not self._settle_pending(max_attempts):
                    return 0
                done += pending.records
            if not self._batch.records:
                break
            # Handed over like any batch (here settled in this thread): records taken after
            # an InsertFailed go to a new batch, never into one whose token is made.
            self._pending, self._batch = self._batch, Batch()
        held, self._held = self._held, []
        self._take(held)
        return done

    def _settle_pending(self, max_attempts: int | None) -> bool:
        batch, future = self._pending, self._future
        assert batch is not None
        self._future = None  # a retry after InsertFailed inserts in this thread
        if not self._settle(batch, future, max_attempts):
            return False
        self._pending = None
        return True

    def _settle(self, batch: Batch, inserting: Future[None] | None,
                max_attempts: int | None) -> bool:
        """Insert ``batch`` (or await ``inserting``, its insert under way), send its dead
        letters, commit its offsets. False: it was dropped uncommitted, with every batch
        behind it."""
        attempt = 0
        self._flushing, self._lost = True, False
        try:
            while True:
                attempt += 1
                try:
                    if inserting is not None:
                        wait, inserting = inserting, None
                        wait.result()
                    else:
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
                        self._drop("revoked" if self._lost else "stopping")
                        return False
            self._commit(batch)
        finally:
            self._flushing = False
            self._resume()
        return True

    def _drop(self, why: str) -> None:
        """Forget every uncommitted record (after the insert under way, if any, ends)."""
        dropped = self._batch.records + (self._pending.records if self._pending else 0)
        if dropped:
            log.warning("dropping %d uncommitted records (%s)", dropped, why)
        self._quiesce()
        self._batch, self._pending, self._held = Batch(), None, []

    def _quiesce(self) -> None:
        """Wait for the insert under way, if any; its outcome no longer matters."""
        future, self._future = self._future, None
        if future is not None:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - the batch is dropped or re-read; logged by _store
                pass

    def _store(self, batch: Batch) -> None:
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

    def _isolate(self, batch: Batch, refusal: Exception) -> None:
        """Insert the batch in halves, down to single records; each refused record is kept
        as an ``undecodable`` row with the store's reason and queued for its dead-letter
        topic. An unavailable store stops it (raised): the next attempt starts over, and the
        halves already in are deduplicated by their tokens."""
        cols = batch.cols
        refused: list[tuple[RawRecord, Exception]] = []

        def insert(rows: list[int]) -> None:
            try:
                self._insert(cols, rows, token_of(ranges_of(cols, rows)))
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
                token = token_of({(raw.topic, raw.partition): [raw.offset, raw.offset]})
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

    def _send_dead_letters(self, batch: Batch) -> None:
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

    def _commit(self, batch: Batch) -> None:
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
            self._lost = True  # a flush is retrying further up this stack; it drops the batches
        elif self._batch.records or self._pending is not None:
            try:
                self.flush(max_attempts=1)  # commit what we have while we still own it
            except InsertFailed as exc:
                log.warning("dropping uncommitted batches on revoke: %s", exc)
                self._drop("revoked")
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
            if flush and (self._batch.records or self._pending is not None):
                was, self._stopping = self._stopping, False
                try:
                    self.flush(max_attempts=3)
                except InsertFailed as exc:
                    log.warning("closing with an unflushed batch (it will be re-read): %s", exc)
                finally:
                    self._stopping = was
        finally:
            # What is left is uncommitted and will be re-read; the revoke that closing the
            # consumer triggers must not try to flush it again. An insert under way ends
            # before the store closes.
            self._drop("closing")
            self._inserter.shutdown(wait=True)
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
    settle_heap()
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
