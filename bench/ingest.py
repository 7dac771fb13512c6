"""Figures of telemetry and replay (issue 5), on the run's broker, embedded ClickHouse (chDB).

- ``telemetry.raw_insert`` (baseline): the rows of N recorded agent-turn records, mapped
  beforehand (not timed), inserted with a bare clickhouse-connect chDB client in batches of
  ``VOICE_TELEMETRY_BATCH_ROWS`` records: rows/s of the store alone.
- ``telemetry.ingest``: the same N records already on Kafka → ``telemetry.sink.Sink`` (consume,
  check each record, insert the raw records into ``voice.envelopes`` whose materialized views
  derive every table, commit) → rows queryable; rows/s from the first record taken to the last
  row counted, and the process's CPU per record over that time (less bent by a loaded machine
  than wall time). Beside the raw insert.
- ``telemetry.lag``: a running sink at the default flush (1,000 ms / 30,000 rows); records
  produced at a steady rate; time from each record's produce to its row being queryable
  (polled every 50 ms), beside the raw Kafka round trip.
- ``kafka.read_topic`` (baseline): a plain Consumer reading a topic that holds one long
  conversation, from the beginning to its end.
- ``replay.records_per_s``: ``deploy.replay.replay_conversation`` of that conversation (read,
  decode, open the sealed content, render each SSE event), beside the raw read; plus
  ``rerun_turn`` of the recorded histories (``tests/histories``) in a loop.

The records are real: the recorded histories' workflow and agent records (sealed content,
~700 bytes on average), each copy with its own key and record id.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import json
import resource
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.harness import Context, Result, benchmark, latency_summary
from streams.reading import end_offset
from streams.settings import VoiceSettings
from streams.topics import AGENT, CONVERSATIONS, create_topics, topic_name

HISTORIES = Path(__file__).resolve().parent.parent / "tests" / "histories"
INGEST_RECORDS = 60_000
LAG_RATE_PER_S = 400
LAG_SECONDS = 15
LAG_POLL_S = 0.05
CONVERSATION_TURNS = 500
RERUN_ROUNDS = 20


@dataclass(frozen=True)
class Raw:
    topic_base: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


@cache
def history_records() -> tuple[list[Raw], ...]:
    """Each recorded history's raw records (workflow lifecycle and agent records)."""
    out = []
    for path in sorted(HISTORIES.glob("*.json")):
        doc = json.loads(path.read_text())
        recs = []
        for topic, items in doc["records"].items():
            for r in items:
                recs.append(Raw(topic, r["key"].encode(), base64.b64decode(r["value"]),
                                [(k, base64.b64decode(v)) for k, v in r["headers"]]))
        out.append(recs)
    return tuple(out)


def corpus(n: int) -> list[Raw]:
    """``n`` records: copies of the histories' turns, each copy with its own key and ids."""
    hist = history_records()
    out: list[Raw] = []
    copy = 0
    while len(out) < n:
        for rec in hist[copy % len(hist)]:
            if len(out) >= n:
                break
            key = rec.key + f"#{copy}".encode()
            headers = [(k, v + f"#{copy}".encode() if k == "ce_id" else v)
                       for k, v in rec.headers]
            out.append(Raw(rec.topic_base, key, rec.value, headers))
        copy += 1
    return out


_STATE_DIRS: list[Path] = []


def _cleanup() -> None:
    for path in _STATE_DIRS:
        shutil.rmtree(path, ignore_errors=True)


atexit.register(_cleanup)


def _settings(ctx: Context, name: str, **extra: Any) -> Any:
    """Telemetry settings of its own: topic prefix, group, state folder (removed when the run
    ends), no query endpoint."""
    from telemetry.store import telemetry_settings

    state = Path(tempfile.mkdtemp(prefix=f"voice-bench-{name}-"))
    _STATE_DIRS.append(state)
    return telemetry_settings(ctx.settings).model_copy(update={
        "topic_prefix": f"{ctx.settings.topic_prefix}voice.bench.{ctx.run_id}.{name}.",
        "group_prefix": f"bench{ctx.run_id}{name}", "state_dir": state,
        "telemetry_query_port": 0, **extra})


def _produce(settings: VoiceSettings, records: list[Raw]) -> None:
    from streams.producer import producer_config

    p = Producer(producer_config(settings))
    for r in records:
        while True:
            try:
                p.produce(f"{settings.topic_prefix}{r.topic_base}", key=r.key, value=r.value,
                          headers=r.headers)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(120):
        raise RuntimeError("corpus not delivered")


def _raws(records: list[Raw], settings: VoiceSettings) -> list[Any]:
    """The records as the sink sees them (``RawRecord``), at made-up offsets."""
    from telemetry.rows import RawRecord

    return [RawRecord(topic=f"{settings.topic_prefix}{r.topic_base}", partition=0, offset=i,
                      key=r.key, value=r.value, headers=tuple(r.headers),
                      timestamp_ms=int(time.time() * 1000)) for i, r in enumerate(records)]


def _cpu_s() -> float:
    """CPU seconds of this process, every thread (the embedded ClickHouse runs in it)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _row_counts(store: Any) -> dict[str, int]:
    from telemetry.sink import TABLES

    return {t: int(store.query(f"SELECT count() FROM voice.{t}").rows[0][0]) for t in TABLES}


# --- telemetry.raw_insert / telemetry.ingest -------------------------------------------------


@benchmark("telemetry.raw_insert")
def raw_insert(ctx: Context) -> Result:
    """The same rows inserted by a bare clickhouse-connect (chDB) client, batch by batch."""
    import clickhouse_connect

    from telemetry.rows import KindCache, Rows, map_record
    from telemetry.schema import DATABASE, column_names, ensure_schema
    from telemetry.sink import TABLES
    from telemetry.store import ClickHouseStore, embedded_path

    settings = _settings(ctx, "rawins")
    records = corpus(INGEST_RECORDS)
    batch_records = settings.telemetry_batch_rows
    kinds = KindCache()
    raws = _raws(records, settings)
    t0 = time.perf_counter()
    batches: list[Rows] = []
    for start in range(0, len(raws), batch_records):
        rows = Rows()
        for raw in raws[start:start + batch_records]:
            rows.extend(map_record(raw, kinds))
        batches.append(rows)
    map_s = time.perf_counter() - t0
    path = embedded_path(settings)
    path.mkdir(parents=True, exist_ok=True)
    client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    store = ClickHouseStore(client, f"chdb://{path}")
    try:
        ensure_schema(store)
        rows_total = 0
        t0 = time.perf_counter()
        for rows in batches:
            for table in TABLES:
                data = rows.tables.get(table)
                if data:
                    client.insert(f"{DATABASE}.{table}", data, column_names=column_names(table))
                    rows_total += len(data)
        elapsed = time.perf_counter() - t0
        counts = _row_counts(store)
    finally:
        store.close()
    if sum(counts.values()) != rows_total:
        raise RuntimeError(f"inserted {rows_total} rows, the store counts {counts}")
    return {"rows_per_s": round(rows_total / elapsed, 1),
            "records_per_s": round(len(records) / elapsed, 1),
            "rows": rows_total, "records": len(records), "rows_by_table": counts,
            "batch_records": batch_records, "seconds": round(elapsed, 3),
            "map_records_per_s": round(len(records) / map_s, 1),
            "note": "map_records_per_s: telemetry.rows.map_record alone (not part of the "
                    "timed insert), the sink's Python side"}


@benchmark("telemetry.ingest", baseline="telemetry.raw_insert",
           compare=("rows_per_s", "records_per_s"))
def ingest(ctx: Context) -> Result:
    """Records on Kafka → the sink → rows queryable (embedded store), rows/s."""
    from streams.heap import settle_heap
    from telemetry.sink import Sink

    settings = _settings(ctx, "ingest")
    ctx.created_topics.extend(create_topics(settings))
    records = corpus(INGEST_RECORDS)
    _produce(settings, records)
    sink = Sink(settings)
    settle_heap()  # as run_sink does
    cpu_first = loop_cpu = 0.0
    try:
        taken, t_first, deadline = 0, None, time.monotonic() + 300
        last_check = 0.0
        counts: dict[str, int] = {}
        while time.monotonic() < deadline:
            before = time.thread_time()
            got = sink.poll_once(timeout=0.2)
            if got and t_first is None:
                t_first, cpu_first = time.perf_counter(), _cpu_s()
            if t_first is not None:  # the first records' check counted too
                loop_cpu += time.thread_time() - before
            taken += got
            now = time.perf_counter()
            if taken >= len(records) and now - last_check > 0.05:
                last_check = now
                counts = _row_counts(sink.store)
                if counts["events"] >= len(records):
                    break
        else:
            raise TimeoutError(f"the sink stored {counts} of {len(records)} records in time")
        t_end, cpu_s = time.perf_counter(), _cpu_s() - cpu_first
    finally:
        sink.close(flush=False)
    assert t_first is not None
    elapsed = t_end - t_first
    rows = sum(counts.values())
    return {"rows_per_s": round(rows / elapsed, 1),
            "records_per_s": round(len(records) / elapsed, 1),
            "rows": rows, "records": len(records), "rows_by_table": counts,
            "seconds": round(elapsed, 3), "batch_records": settings.telemetry_batch_rows,
            "flush_ms": settings.telemetry_flush_ms,
            "cpu_us_per_record": round(cpu_s / len(records) * 1e6, 1),
            "loop_cpu_us_per_record": round(loop_cpu / len(records) * 1e6, 1),
            "note": "from the first record taken (group joined) to every row counted; "
                    "cpu_us_per_record: this process (sink, librdkafka and chDB threads); "
                    "loop_cpu_us_per_record: the sink's loop thread alone (consume, check, "
                    "columns; the inserter thread and chDB are the rest)"}


# --- telemetry.lag ---------------------------------------------------------------------------


@benchmark("telemetry.lag", baseline="kafka.round_trip", compare=("p50_ms", "p99_ms"))
def lag(ctx: Context) -> Result:
    """A record's produce → its row queryable, through a running sink at the default flush."""
    from streams.heap import settle_heap
    from streams.producer import producer_config
    from telemetry.sink import Sink

    settings = _settings(ctx, "lag")
    ctx.created_topics.extend(create_topics(settings))
    records = corpus(LAG_RATE_PER_S * LAG_SECONDS)
    topic = topic_name(settings, AGENT)
    records = [Raw("voice.agent", r.key, r.value, r.headers) for r in records]
    sink = Sink(settings)
    settle_heap()  # as run_sink does
    stop = threading.Event()
    errors: list[BaseException] = []

    def run_sink() -> None:
        try:
            while not stop.is_set():
                sink.poll_once(timeout=0.05)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # Join the group before the clock starts: a produced record waits for no rebalance.
    t_join = time.monotonic()
    while not sink.consumer.assignment() and time.monotonic() - t_join < 60:
        sink.poll_once(timeout=0.1)
    thread = threading.Thread(target=run_sink, name="bench-sink", daemon=True)
    thread.start()

    producer = Producer(producer_config(settings))
    sent: dict[tuple[int, int], float] = {}
    seen_at: dict[tuple[int, int], float] = {}
    high: dict[int, int] = {}

    def poll_rows() -> None:
        res = sink.store.query(f"SELECT partition, max(offset) FROM voice.events "
                               f"WHERE topic = '{topic}' GROUP BY partition")
        now = time.time()
        for partition, offset in res.rows:
            for o in range(high.get(partition, -1) + 1, offset + 1):
                seen_at[(partition, o)] = now
            high[partition] = max(offset, high.get(partition, -1))

    try:
        start = time.perf_counter()
        next_poll = start
        for i, r in enumerate(records):
            at = start + i / LAG_RATE_PER_S
            while True:
                now = time.perf_counter()
                if now >= next_poll:
                    poll_rows()
                    next_poll = now + LAG_POLL_S
                if now >= at:
                    break
                time.sleep(max(0.0, min(at, next_poll) - now))
            t = time.time()

            def delivered(err: Any, msg: Any, t: float = t) -> None:
                if err is None:
                    sent[(msg.partition(), msg.offset())] = t

            producer.produce(topic, key=r.key, value=r.value, headers=r.headers,
                             on_delivery=delivered)
            producer.poll(0)
        producer.flush(30)
        deadline = time.perf_counter() + 30
        while len(seen_at) < len(records) and time.perf_counter() < deadline:
            poll_rows()
            time.sleep(LAG_POLL_S)
    finally:
        stop.set()
        thread.join(30)
        sink.close(flush=False)
    if errors:
        raise errors[0]
    lags = [seen_at[k] - t for k, t in sent.items() if k in seen_at]
    missing = len(records) - len(lags)
    if missing:
        unseen = sorted(k for k in sent if k not in seen_at)
        raise RuntimeError(
            f"{missing} of {len(records)} records never became queryable: "
            f"{len(records) - len(sent)} not acknowledged by the broker, {len(unseen)} "
            f"acknowledged and not in voice.events (partition, offset: {unseen[:10]}; the "
            f"highest offset queryable per partition: {dict(sorted(high.items()))})")
    return {**latency_summary(lags), "rate_per_s": LAG_RATE_PER_S,
            "flush_ms": settings.telemetry_flush_ms,
            "batch_records": settings.telemetry_batch_rows, "poll_ms": LAG_POLL_S * 1000,
            "note": "includes up to one poll interval of the measuring query"}


# --- replay ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LongConversation:
    settings: Any
    conversation: str
    records: int
    sealer: Any


_LONG: dict[str, LongConversation] = {}


def long_conversation(ctx: Context) -> LongConversation:
    """One conversation of ``CONVERSATION_TURNS`` turns on a topic of its own (made once)."""
    if ctx.run_id in _LONG:
        return _LONG[ctx.run_id]
    from consumers.conversations.sequencer import ConversationSequencer
    from consumers.frame.writer import outputs as writer_outputs
    from schemas.conversation import (
        ProposalRecorded,
        ReplyRecorded,
        SendMessage,
        StartConversation,
        TurnStateChanged,
    )
    from streams.envelope import Envelope, encode
    from streams.producer import producer_config
    from streams.sealing import MemoryKeyStore, Sealer

    settings = ctx.settings.model_copy(update={
        "topic_prefix": f"{ctx.settings.topic_prefix}voice.bench.{ctx.run_id}.replay."})
    ctx.created_topics.extend(create_topics(settings))
    conv = "cnv-00000000deadbeef"
    sealer = Sealer(MemoryKeyStore())
    sealer.create(conv)
    src = "/voice/bench"

    sequencer = ConversationSequencer()

    def sequence(state: Any, env: Envelope) -> tuple[Any, list[Any]]:
        return writer_outputs(sequencer, state, env)

    def cmd(record: Any, cid: str) -> Envelope:
        return Envelope(record=record, key=conv, source=src, subject=conv, id=cid)

    state, out = sequence(None, cmd(StartConversation(conversation=conv, owner="bench"), "c0"))
    outputs = list(out)
    for i in range(CONVERSATION_TURNS):
        mid = f"m{i}"
        text = sealer.seal(conv, mid, f"The crossing by the school is unsafe ({i}).")
        state, out = sequence(state, cmd(SendMessage(conversation=conv, message_id=mid,
                                                     text=text), f"s{i}"))
        outputs += out
        turn = out[-1][1].record.detail["turn"]  # type: ignore[attr-defined]
        rid, pid = f"{turn}:reply", f"{turn}:proposal"
        for part, record in (
            ("reply", ReplyRecorded(conversation=conv, turn=turn, reply_id=rid,
                                    text=sealer.seal(conv, rid, "I heard 1 concern: …"))),
            ("proposal", ProposalRecorded(conversation=conv, turn=turn, proposal_id=pid,
                                          proposal=sealer.seal_json(conv, pid, {
                                              "concerns": [{"statement": "unsafe crossing",
                                                            "quote": "unsafe"}]}))),
            ("state", TurnStateChanged(conversation=conv, turn=turn, state="Replied"))):
            state, out = sequence(state, cmd(record, f"{turn}:{part}"))
            outputs += out
    p = Producer(producer_config(settings))
    n = 0
    for spec, env in outputs:
        if spec is CONVERSATIONS:
            key, value, headers = encode(env)
            p.produce(topic_name(settings, CONVERSATIONS), key=key, value=value, headers=headers)
            n += 1
            p.poll(0)
    if p.flush(60):
        raise RuntimeError("conversation not delivered")
    _LONG[ctx.run_id] = LongConversation(settings, conv, n, sealer)
    return _LONG[ctx.run_id]


@benchmark("kafka.read_topic")
def read_topic_raw(ctx: Context) -> Result:
    """Raw Kafka: a plain Consumer reads the long conversation's topic from its beginning."""
    lc = long_conversation(ctx)
    topic = topic_name(lc.settings, CONVERSATIONS)
    runs = []
    for r in range(ctx.runs):
        c = Consumer({"bootstrap.servers": ctx.bootstrap, "group.id": f"bench-read-{r}",
                      "enable.auto.commit": False})
        try:
            t0 = time.perf_counter()
            md = c.list_topics(topic, timeout=10)
            parts = list(md.topics[topic].partitions)
            # Asked again while the broker answers "not leader" for a moment after the
            # topic's creation.
            ends = {p: end_offset(c, TopicPartition(topic, p), 10) for p in parts}
            todo = {p for p in parts if ends[p] > 0}
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
            n = 0
            while todo:
                for msg in c.consume(num_messages=1000, timeout=0.2):
                    if msg.error():
                        continue
                    if msg.key() == lc.conversation.encode():
                        n += 1
                    if msg.offset() + 1 >= ends[msg.partition()]:
                        todo.discard(msg.partition())
            runs.append({"records": n, "seconds": time.perf_counter() - t0})
        finally:
            c.close()
    best = sorted(runs, key=lambda x: x["seconds"])[(len(runs) - 1) // 2]
    return {"records_per_s": round(best["records"] / best["seconds"], 1),
            "records": best["records"], "seconds": round(best["seconds"], 4),
            "runs": [round(r["seconds"], 4) for r in runs]}


@benchmark("replay.records_per_s", baseline="kafka.read_topic", compare=("records_per_s",))
def replay(ctx: Context) -> Result:
    """replay_conversation of a long conversation (read, decode, open, render); histories re-run."""
    from deploy.histories import load_history
    from deploy.replay import replay_conversation, rerun_turn

    lc = long_conversation(ctx)
    runs = []
    events = 0
    for _ in range(ctx.runs):
        t0 = time.perf_counter()
        events = sum(1 for _ in replay_conversation(lc.settings, lc.conversation, lc.sealer))
        runs.append(time.perf_counter() - t0)
    seconds = sorted(runs)[(len(runs) - 1) // 2]

    loaded = [load_history(p) for p in sorted(HISTORIES.glob("*.json"))]
    base = VoiceSettings()

    async def rerun_all() -> tuple[int, int, list[str]]:
        turns = recs = 0
        diverged: list[str] = []
        for _ in range(RERUN_ROUNDS):
            for workflow, sealer, envs in loaded:
                found = await rerun_turn(base, workflow, envs["voice.workflows"],
                                         envs["voice.agent"], sealer)
                diverged += found
                turns += 1
                recs += len(envs["voice.workflows"]) + len(envs["voice.agent"])
        return turns, recs, diverged

    t0 = time.perf_counter()
    turns, recs, diverged = asyncio.run(rerun_all())
    rerun_s = time.perf_counter() - t0
    kinds: Counter[str] = Counter()
    for _w, _s, envs in loaded:
        for topic, recorded in envs.items():
            kinds[topic] += len(recorded)
    return {"records_per_s": round(lc.records / seconds, 1), "records": lc.records,
            "sse_events": events, "seconds": round(seconds, 4),
            "turns_in_conversation": CONVERSATION_TURNS, "runs": [round(r, 4) for r in runs],
            "rerun": {"turns": turns, "records": recs, "seconds": round(rerun_s, 3),
                      "turns_per_s": round(turns / rerun_s, 1),
                      "records_per_s": round(recs / rerun_s, 1),
                      "histories": len(loaded), "divergences": len(diverged),
                      "records_per_round": dict(kinds)},
            "note": "replay reads the whole conversations topic and keeps this key's records; "
                    "here the topic holds only this conversation"}
