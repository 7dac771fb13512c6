"""The sink's batching and flush order, with a scripted consumer and the embedded store.

(The same guarantees against a real broker are in tests/integration/test_telemetry_sink.py.)
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest
from confluent_kafka import TopicPartition

from schemas.agent import ModelCallRecorded
from streams.envelope import Envelope, encode
from telemetry.sink import InsertFailed, Sink
from telemetry.store import ClickHouseStore, TelemetrySettings, open_store

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Msg:
    def __init__(self, topic: str, partition: int, offset: int, key, value, headers) -> None:
        self._t = (topic, partition, offset, key, value, headers)
        self.ts_ms = 1_700_000_000_000  # long ago: a sink reading it is catching up

    def error(self):
        return None

    def topic(self):
        return self._t[0]

    def partition(self):
        return self._t[1]

    def offset(self):
        return self._t[2]

    def key(self):
        return self._t[3]

    def value(self):
        return self._t[4]

    def headers(self):
        return self._t[5]

    def timestamp(self):
        return (1, self.ts_ms)


class FakeConsumer:
    """Hands out queued messages; records pause/resume/commit in the shared ``log``."""

    def __init__(self, log: list[str]) -> None:
        self.queue: list[Msg] = []
        self.log = log
        self.committed: list[TopicPartition] = []
        self.paused = False
        self.arrivals: list[Msg] = []  # what comes while a ``poll`` waits
        self.waits: list[object] = []  # each call's timeout

    def subscribe(self, topics, on_assign=None, on_revoke=None):
        self.topics, self.on_revoke = topics, on_revoke

    def consume(self, num_messages=1, timeout=-1):
        self.waits.append(timeout)
        if self.paused:
            return []
        out, self.queue = self.queue[:num_messages], self.queue[num_messages:]
        return out

    def poll(self, timeout=-1):
        self.waits.append(("poll", timeout))
        if self.paused or not self.queue:
            self.queue.extend(self.arrivals)
            self.arrivals = []
        if self.paused or not self.queue:
            return None
        return self.queue.pop(0)

    def assignment(self):
        return [TopicPartition("voice.agent", 0)]

    def pause(self, parts):
        self.paused = True
        self.log.append("pause")

    def resume(self, parts):
        self.paused = False
        self.log.append("resume")

    def commit(self, offsets=None, asynchronous=True):
        assert asynchronous is False
        self.committed = list(offsets)
        self.log.append("commit " + ",".join(f"{o.topic}:{o.partition}:{o.offset}"
                                             for o in offsets))

    def close(self):
        self.log.append("close")


class FlakyStore:
    """The real embedded store, whose inserts fail while ``failures`` > 0 (after the rows went
    in, when ``after`` is set: to show that an insert retried does not duplicate)."""

    def __init__(self, inner: ClickHouseStore, log: list[str]) -> None:
        self.inner, self.log, self.failures, self.after = inner, log, 0, False
        self.location = inner.location

    def command(self, sql):
        self.inner.command(sql)

    def query(self, sql):
        return self.inner.query(sql)

    def insert(self, table, columns, rows, token=None):
        if self.failures and table != "voice.events":
            self.failures -= 1
            self.log.append(f"insert {table} FAILED")
            raise ConnectionError("ClickHouse is down")
        self.inner.insert(table, columns, rows, token=token)
        if table != "voice.schema_migrations":
            self.log.append(f"insert {table}")

    def insert_arrow(self, table, data, token=None):
        if self.failures and not self.after:
            self.failures -= 1
            self.log.append(f"insert {table} FAILED")
            raise ConnectionError("ClickHouse is down")
        self.inner.insert_arrow(table, data, token=token)
        self.log.append(f"insert {table}")
        if self.failures:  # the rows are in, the answer is lost
            self.failures -= 1
            self.log.append(f"insert {table} FAILED")
            raise ConnectionError("ClickHouse went away")

    def close(self):
        self.inner.close()


def msg(i: int, partition: int = 0) -> Msg:
    rec = ModelCallRecorded(workflow="wf", call_id=f"c{i}", agent_name="a", iteration=1,
                            request_model="m", input_tokens=i)
    k, v, h = encode(Envelope(record=rec, key="wf", source="/t", time=T0))
    return Msg("voice.agent", partition, i, k, v, h)


S = TypeVar("S", bound="FlakyStore")


@contextmanager
def sink_over(tmp_path: Path, store_type: type[S], **settings_kw: object
              ) -> Iterator[tuple[list[str], FakeConsumer, S, Sink]]:
    """A sink on a fake consumer and a ``store_type`` over a real embedded store: batches of
    5 records, flushed by count only (unless ``settings_kw`` say otherwise); (log of what
    happened, consumer, store, sink)."""
    log: list[str] = []
    settings = TelemetrySettings(state_dir=tmp_path, env="test", kafka_bootstrap="unused:1",
                                 **{"telemetry_batch_rows": 5, "telemetry_flush_ms": 60_000,
                                    **settings_kw})
    consumer, store = FakeConsumer(log), store_type(open_store(settings), log)
    sink = Sink(settings, store=store, consumer=consumer, retry_initial_s=0.01)
    try:
        yield log, consumer, store, sink
    finally:
        if isinstance(store, GatedStore):
            store.gate.set()
        sink.close(flush=False)


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[list[str], FakeConsumer, FlakyStore, Sink]]:
    with sink_over(tmp_path, FlakyStore) as made:
        yield made


def count(store, table: str) -> int:
    return store.query(f"SELECT count() FROM voice.{table}").rows[0][0]


def test_subscribes_to_every_topic_and_its_dlq(parts):
    _, consumer, _, _ = parts
    assert "voice.agent" in consumer.topics and "voice.agent.dlq" in consumer.topics
    from streams.settings import VoiceSettings
    from streams.topics import KEYS, record_specs, topic_name

    assert sorted(consumer.topics) == sorted(topic_name(VoiceSettings(), s) for s in record_specs())
    assert topic_name(VoiceSettings(), KEYS) not in consumer.topics  # wrapped keys stay out


def until(check, what: str, timeout: float = 30.0):
    """Poll ``check`` until it is true (the inserter thread works at its own pace)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_flush_on_row_count_then_insert_then_commit(parts):
    log, consumer, store, sink = parts
    consumer.queue = [msg(i) for i in range(7)]
    sink.poll_once()  # takes at most the 5 the batch has room for, and hands them over
    until(lambda: "insert voice.envelopes" in log, "the insert")
    assert consumer.committed == []  # the loop commits, once it sees the insert done
    sink.poll_once()  # settles the 5; 2 more wait for the 5th or the age
    assert log == ["insert voice.envelopes", "commit voice.agent:0:5"]
    assert count(store, "events") == 5 and count(store, "model_calls") == 5


def test_flush_on_age(tmp_path, parts):
    log, consumer, _, sink = parts
    now = [100.0]
    sink._clock = lambda: now[0]
    consumer.queue = [msg(0)]
    sink.poll_once()
    assert log == []
    now[0] += 59.0
    sink.poll_once(timeout=0)
    assert log == []
    now[0] += 1.0
    sink.poll_once(timeout=0)  # due: handed over
    until(lambda: "insert voice.envelopes" in log, "the insert")
    sink.poll_once(timeout=0)
    assert log == ["insert voice.envelopes", "commit voice.agent:0:1"]


def test_a_record_into_an_empty_batch_is_taken_as_it_comes(parts):
    """Regression: an empty batch waited in ``consume(room, 0.5)`` for the whole half second
    even when a record came at once, and its age (the flush) began only then."""
    _log, consumer, _, sink = parts
    now = [100.0]
    sink._clock = lambda: now[0]
    fresh = msg(0)
    fresh.ts_ms = int(time.time() * 1000)  # keeping pace (catching up waits less: below)
    consumer.arrivals = [fresh]
    assert sink.poll_once(timeout=0.5) == 1 and sink._batch.started == 100.0
    assert all(w == 0 for w in consumer.waits if not isinstance(w, tuple))  # never waited
    assert ("poll", 0.5) in consumer.waits  # the wait that a record ends
    consumer.waits.clear()
    now[0] += 0.2
    sink.poll_once(timeout=0.5)  # a batch begun fills until it is due: that wait is kept
    assert consumer.waits == [pytest.approx(0.5)]


def test_a_batch_holds_nothing_the_collector_walks(parts):
    # A batch lives for seconds; whatever of it the collector tracks is promoted to its oldest
    # generation and rescanned by every full collection (docs/benchmarks.md: ~5 µs a record).
    log, consumer, store, sink = parts
    consumer.queue = [msg(i) for i in range(4)]
    sink.poll_once()
    gc.collect()
    gc.collect()  # a tuple is let go once its items have been, at the latest the pass after
    headers = sink._batch.cols.headers
    assert len(headers) == 4 and not any(gc.is_tracked(h) for h in headers)


class GatedStore(FlakyStore):
    """Inserts wait for ``gate``: the store is slow, and the test says when it answers."""

    def __init__(self, inner: ClickHouseStore, log: list[str]) -> None:
        super().__init__(inner, log)
        self.gate = threading.Event()

    def insert_arrow(self, table, data, token=None):
        self.log.append("inserting")
        assert self.gate.wait(30)
        super().insert_arrow(table, data, token=token)


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[list[str], FakeConsumer, GatedStore, Sink]]:
    with sink_over(tmp_path, GatedStore) as made:
        yield made


def test_the_next_batch_is_taken_while_one_is_inserted_and_commits_stay_in_order(gated):
    log, consumer, store, sink = gated
    consumer.queue = [msg(i) for i in range(5)]
    sink.poll_once()  # 5: handed over; its insert waits for the store
    until(lambda: "inserting" in log, "the insert to start")
    consumer.queue = [msg(i) for i in range(5, 8)]
    assert sink.poll_once() == 3  # taken and checked while the store works
    assert consumer.committed == [] and "insert voice.envelopes" not in log
    store.gate.set()
    until(lambda: "insert voice.envelopes" in log, "the insert")
    sink.poll_once(timeout=0)
    assert log[-1] == "commit voice.agent:0:5"  # the first batch: after its insert
    assert sink.flush() == 3
    assert log == ["inserting", "insert voice.envelopes", "commit voice.agent:0:5",
                   "inserting", "insert voice.envelopes", "commit voice.agent:0:8"]
    assert count(store, "events") == 8


def test_a_batch_of_age_grows_while_the_inserter_works_then_goes(gated):
    log, consumer, store, sink = gated
    now = [100.0]
    sink._clock = lambda: now[0]
    consumer.queue = [msg(i) for i in range(5)]
    sink.poll_once()  # full: handed over; its insert waits for the store
    until(lambda: "inserting" in log, "the insert to start")
    consumer.queue = [msg(5)]
    sink.poll_once(timeout=0)
    now[0] += 61.0  # of age, but the inserter is busy: it keeps growing
    consumer.queue = [msg(6), msg(7)]
    assert sink.poll_once(timeout=0) == 2
    assert log == ["inserting"]
    store.gate.set()
    until(lambda: "insert voice.envelopes" in log, "the insert")
    sink.poll_once(timeout=0)  # settles the first; the second, of age, goes
    until(lambda: log.count("insert voice.envelopes") == 2, "the second insert")
    sink.poll_once(timeout=0)
    assert [e for e in log if e.startswith("commit")] == ["commit voice.agent:0:5",
                                                          "commit voice.agent:0:8"]


def test_catching_up_a_batch_of_eager_rows_goes_to_a_free_inserter_and_grows_behind_a_busy_one(
        tmp_path):
    with sink_over(tmp_path, GatedStore, telemetry_eager_rows=3) as (log, consumer, store, sink):
        sink._clock = lambda: 100.0  # no batch ever comes of age here
        consumer.queue = [msg(0), msg(1)]
        sink.poll_once(timeout=0)
        assert log == []  # 2 records, young: they wait
        consumer.queue = [msg(2)]
        sink.poll_once(timeout=0)  # 3, and the inserter is free: handed over, not yet of age
        until(lambda: "inserting" in log, "the insert to start")
        consumer.queue = [msg(i) for i in range(3, 7)]
        assert sink.poll_once(timeout=0) == 4  # 4 ≥ 3, but the inserter works: they grow
        assert log == ["inserting"]
        store.gate.set()
        until(lambda: "insert voice.envelopes" in log, "the insert")
        sink.poll_once(timeout=0)  # settles the first; the second goes at once
        until(lambda: log.count("insert voice.envelopes") == 2, "the second insert")
        sink.poll_once(timeout=0)
        assert [e for e in log if e.startswith("commit")] == ["commit voice.agent:0:3",
                                                              "commit voice.agent:0:7"]


def test_catching_up_the_backlogs_last_batch_goes_once_a_wait_brings_nothing(tmp_path):
    """Regression: the last batch of a backlog, fewer than ``telemetry_eager_rows``, waited a
    whole flush for its age after its first record, with the inserter free (0.1–1 s of the
    bench's ``telemetry.ingest``)."""
    with sink_over(tmp_path, GatedStore, telemetry_eager_rows=3) as (log, consumer, store, sink):
        sink._clock = lambda: 100.0  # no batch ever comes of age here
        consumer.queue = [msg(0), msg(1)]
        sink.poll_once(timeout=0.5)
        assert log == [] and sink._batch.records == 2  # 2 < 3: more may come
        assert sink.poll_once(timeout=0.5) == 0  # a wait that brought nothing: read through
        until(lambda: "inserting" in log, "the insert to start")
        assert consumer.waits[-1] == pytest.approx(0.02)  # catching up, the waits are short
        consumer.queue = [msg(2), msg(3)]  # a backlog again, the inserter busy: they grow
        sink.poll_once(timeout=0.5)
        assert sink.poll_once(timeout=0.5) == 0 and sink._batch.drained
        assert log == ["inserting"]
        store.gate.set()
        until(lambda: "insert voice.envelopes" in log, "the insert")
        sink.poll_once(timeout=0.5)  # settles the first; the second goes at once
        assert consumer.waits[-1] == 0  # due as soon as the inserter is free: no wait
        until(lambda: log.count("insert voice.envelopes") == 2, "the second insert")
        sink.poll_once(timeout=0)
        assert [e for e in log if e.startswith("commit")] == ["commit voice.agent:0:2",
                                                              "commit voice.agent:0:4"]


def test_keeping_pace_a_batch_of_eager_rows_waits_for_its_age(tmp_path):
    with sink_over(tmp_path, FlakyStore, telemetry_eager_rows=3) as (log, consumer, store, sink):
        now = [100.0]
        sink._clock = lambda: now[0]
        fresh = [msg(i) for i in range(4)]
        for m in fresh:
            m.ts_ms = int(time.time() * 1000)  # just produced: the sink keeps pace
        consumer.queue = fresh
        sink.poll_once(timeout=0)
        assert log == [] and sink._batch.records == 4  # 4 ≥ 3, yet it waits: inserts cost
        now[0] += 60.0
        sink.poll_once(timeout=0)  # of age: handed over
        until(lambda: "insert voice.envelopes" in log, "the insert")


class ErrorMsg(Msg):
    """What ``consume`` hands out for a transient broker error: not a record."""

    def __init__(self) -> None:
        super().__init__("voice.agent", 0, -1001, None, None, None)

    def error(self):
        return "Broker: transient failure"


def test_an_error_in_a_consume_result_is_logged_and_the_records_around_it_taken(parts, caplog):
    log, consumer, store, sink = parts
    consumer.queue = [msg(0), ErrorMsg(), msg(1)]
    assert sink.poll_once() == 2
    assert sink._batch.cols.offset == [0, 1]
    assert "Broker: transient failure" in caplog.text
    consumer.queue = [ErrorMsg()]
    assert sink.poll_once() == 0 and sink._batch.started is not None
    assert sink.flush() == 2 and count(store, "events") == 2


def test_a_dropped_batch_drops_the_one_behind_it(gated):
    log, consumer, store, sink = gated
    consumer.queue = [msg(i) for i in range(7)]
    sink.poll_once()  # 0-4 handed over; their insert waits for the store
    until(lambda: "inserting" in log, "the insert to start")
    sink.poll_once()  # 5-6 taken behind them
    store.failures = 10**6
    store.gate.set()  # … which fails
    sink._wait = lambda s: sink._on_revoke(consumer, consumer.assignment())
    # Revoked while the first batch waits for the store: committing 5-6 would commit past
    # 0-4, never stored. Both are dropped, for the next owner to read again.
    assert sink.flush() == 0 and consumer.committed == []
    store.failures = 0
    consumer.queue = [msg(i) for i in range(7)]
    sink.poll_once()
    sink.poll_once()
    assert sink.flush() == 7 and [o.offset for o in consumer.committed] == [7]
    assert [e for e in log if e.startswith("commit")] == ["commit voice.agent:0:5",
                                                          "commit voice.agent:0:7"]
    assert count(store, "events") == 7


def test_failed_insert_commits_nothing_and_keeps_the_batch(parts):
    log, consumer, store, sink = parts
    consumer.queue = [msg(i) for i in range(3)]
    sink.poll_once()
    store.failures = 10**6
    with pytest.raises(InsertFailed):
        sink.flush(max_attempts=3)
    assert not any(e.startswith("commit") for e in log) and consumer.committed == []
    assert log.count("pause") == 1 and log[-1] == "resume"  # paused while retrying
    store.failures = 0
    assert sink.flush() == 3
    assert log[-1] == "commit voice.agent:0:3"
    assert count(store, "events") == 3 and count(store, "model_calls") == 3


def test_retry_after_an_insert_whose_answer_was_lost_does_not_duplicate(parts):
    log, consumer, store, sink = parts
    consumer.queue = [msg(i) for i in range(4)]
    sink.poll_once()
    store.failures, store.after = 2, True  # the rows go in, the answer is lost, twice
    assert sink.flush() == 4
    assert log == ["insert voice.envelopes", "insert voice.envelopes FAILED", "pause",
                   "insert voice.envelopes", "insert voice.envelopes FAILED",
                   "insert voice.envelopes", "commit voice.agent:0:4", "resume"]
    # Inserted three times with one token: every view's table dropped the repeats (raw
    # counts, no FINAL, no merge needed).
    assert count(store, "events") == 4 and count(store, "model_calls") == 4


def test_stop_during_an_outage_drops_the_uncommitted_batch(parts):
    log, consumer, store, sink = parts
    consumer.queue = [msg(i) for i in range(2)]
    sink.poll_once()
    store.failures = 10**6
    real_wait = sink._wait

    def wait_then_stop(seconds):
        real_wait(seconds)
        sink.request_stop()  # SIGTERM arrives while the sink waits for ClickHouse

    sink._wait = wait_then_stop
    assert sink.flush() == 0
    assert consumer.committed == [] and not any(e.startswith("commit") for e in log)


def test_revoke_while_retrying_abandons_the_batch(parts):
    log, consumer, store, sink = parts
    consumer.queue = [msg(i) for i in range(2)]
    sink.poll_once()
    store.failures = 10**6
    sink._wait = lambda s: sink._on_revoke(consumer, consumer.assignment())
    assert sink.flush() == 0 and consumer.committed == []
    store.failures = 0
    consumer.queue = [msg(0), msg(1)]  # the next owner (here: us again) re-reads them
    sink.poll_once()
    assert sink.flush() == 2 and count(store, "events") == 2


def test_undecodable_records_are_rows_and_the_sink_goes_on(parts):
    log, consumer, store, sink = parts
    consumer.queue = [Msg("voice.commands", 1, 0, None, b"\x00\xff", None), msg(1)]
    sink.poll_once()
    sink.flush()
    rows = store.query("SELECT ce_type, decode_error != '' FROM voice.events ORDER BY topic").rows
    assert rows == [("voice.agent.model_call.v1", None), ("undecodable", True)]
    assert sorted(log[-1].split(" ")[1].split(",")) == ["voice.agent:0:2", "voice.commands:1:1"]


# --- records the sink cannot store (decision 0008) ------------------------------------------


class DeadLetterBox:
    """The sink's dead-letter path, in memory: journals each send in the shared log."""

    def __init__(self, log: list[str], failures: int = 0) -> None:
        self.log, self.failures = log, failures
        self.sent: list[tuple[str, int, str]] = []

    def __call__(self, raw, reason: str) -> None:
        if self.failures:
            self.failures -= 1
            self.log.append("dead letter FAILED")
            raise ConnectionError("broker away")
        self.sent.append((raw.topic, raw.offset, reason))
        self.log.append(f"dead letter {raw.topic}:{raw.offset}")


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[tuple[list[str], FakeConsumer, FlakyStore, Sink,
                                              DeadLetterBox]]:
    log: list[str] = []
    settings = TelemetrySettings(state_dir=tmp_path, env="test", kafka_bootstrap="unused:1",
                                 telemetry_batch_rows=100, telemetry_flush_ms=60_000,
                                 consumer_retry_attempts=2)
    consumer, store = FakeConsumer(log), FlakyStore(open_store(settings), log)
    box = DeadLetterBox(log)
    sink = Sink(settings, store=store, consumer=consumer, retry_initial_s=0.0,
                dead_letter=box)
    yield log, consumer, store, sink, box
    sink.close(flush=False)


def poison(offset: int, topic: str = "voice.agent") -> Msg:
    """Decodable, yet the store refuses its rows: a seq past Int64."""
    rec = ModelCallRecorded(workflow="wf", call_id="bad", agent_name="a", iteration=1,
                            request_model="m")
    k, v, h = encode(Envelope(record=rec, key="wf", source="/t", time=T0, seq=2**70))
    return Msg(topic, 0, offset, k, v, h)


def test_a_record_the_store_refuses_is_isolated_dead_lettered_and_the_rest_stored(guarded):
    log, consumer, store, sink, box = guarded
    consumer.queue = [msg(0), msg(1), poison(2), msg(3), msg(4)]
    sink.poll_once()
    assert sink.flush() == 5
    # The four good records are in; the refused one is an undecodable row with the reason.
    assert count(store, "model_calls") == 4
    rows = store.query("SELECT offset, ce_type, decode_error FROM voice.events FINAL "
                       "ORDER BY offset").rows
    assert [r[:2] for r in rows] == [(0, "voice.agent.model_call.v1"),
                                     (1, "voice.agent.model_call.v1"), (2, "undecodable"),
                                     (3, "voice.agent.model_call.v1"),
                                     (4, "voice.agent.model_call.v1")]
    assert rows[2][2] == "telemetry: the store refused its rows: RowsRefused"
    [(topic, offset, reason)] = box.sent
    assert (topic, offset) == ("voice.agent", 2) and reason == rows[2][2]
    # Dead letter first, then the commit past it.
    assert log.index("dead letter voice.agent:2") < log.index("commit voice.agent:0:5")
    assert sink.dead_lettered == 1


def test_an_unavailable_store_is_waited_for_never_taken_for_a_refusal(guarded):
    log, consumer, store, sink, box = guarded
    consumer.queue = [msg(0), msg(1)]
    sink.poll_once()
    store.failures = 5  # ConnectionError, more times than the policy's attempts
    assert sink.flush() == 2
    assert box.sent == [] and count(store, "model_calls") == 2
    assert log[-2:] == ["commit voice.agent:0:2", "resume"]


def test_undecodable_records_are_dead_lettered_by_the_sink_only_where_no_worker_reads(guarded):
    log, consumer, store, sink, box = guarded
    consumer.queue = [Msg("voice.agent", 0, 0, b"k", b"\xff", None),        # sink only
                      Msg("voice.commands", 0, 0, b"k", b"\xff", None),     # a worker's
                      Msg("voice.agent.dlq", 0, 0, b"k", b"\xff", None)]    # a dead letter
    sink.poll_once()
    sink.flush()
    assert [(t, o) for t, o, _r in box.sent] == [("voice.agent", 0)]
    assert box.sent[0][2] == "telemetry: ce_specversion is None, expected '1.0'"
    assert count(store, "events") == 3  # each is still a row, with its reason


def test_a_dead_letter_that_fails_holds_the_commit_until_it_goes(guarded):
    log, consumer, store, sink, box = guarded
    consumer.queue = [msg(0), Msg("voice.acks", 1, 7, b"k", b"\xff", None)]
    sink.poll_once()
    box.failures = 10**6
    with pytest.raises(InsertFailed):
        sink.flush(max_attempts=3)
    assert consumer.committed == [] and not any(e.startswith("commit") for e in log)
    box.failures = 2
    assert sink.flush() == 2
    assert box.sent == [("voice.acks", 7, "telemetry: ce_specversion is None, expected '1.0'")]
    assert count(store, "events") == 2  # the retried flush inserted nothing twice
    assert log[-3:-1] == ["dead letter voice.acks:7", "commit voice.acks:1:8,voice.agent:0:1"]


def test_a_refused_record_of_a_dead_letter_topic_is_counted_not_dead_lettered_again(guarded):
    log, consumer, store, sink, box = guarded
    consumer.queue = [poison(0, "voice.agent.dlq"), msg(1)]
    sink.poll_once()
    assert sink.flush() == 2
    assert box.sent == [] and sink.skipped == 1 and count(store, "model_calls") == 1
    assert log[-2] == "commit voice.agent:0:2,voice.agent.dlq:0:1"
