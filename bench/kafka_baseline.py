"""Plain-Kafka baselines, and the Voice figures measured beside them.

Baselines (confluent-kafka only, producer settings exactly ``PRODUCER_CONFIG``):

* ``kafka.round_trip``: produce one record → the same record returned by a Consumer already
  assigned to the end of the partition; sequential (the next record is produced only once the
  previous one was consumed). p50/p90/p99/mean ms.
* ``kafka.produce_ack``: produce one record → its delivery callback (the broker's ack, acks=all);
  sequential. p50/p90/p99/mean ms.
* ``kafka.produce_throughput``: N records of ~300 bytes produced as fast as ``produce()`` takes
  them, then ``flush()``; records/s and MB/s, median of the runs.

Figures (through Voice's code, compared with a baseline of the same run):

* ``voice.send_latency`` beside ``kafka.produce_ack``: ``await RecordProducer.send(env)``, one at a
  time; the record's Envelope is built and CloudEvents-encoded inside the timing.
* ``voice.send_throughput`` beside ``kafka.produce_throughput``: the same records, same keys and
  same JSON values, as Envelopes through ``RecordProducer.send`` from concurrent senders; the
  ratio is Voice's encoding overhead (Envelope, CloudEvents headers, the asyncio future per
  record).

The raw values *are* the JSON the Voice path writes as its value (``record.model_dump_json()``),
so the two paths differ only by what Voice adds.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from dataclasses import dataclass
from functools import cache

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from bench.harness import Context, Result, benchmark, latency_summary, median_run, warmup
from bench.stack import cpu_seconds
from schemas.base import Sealed
from schemas.conversation import MessageRecorded
from streams.envelope import Envelope, encode
from streams.producer import PRODUCER_CONFIG, RecordProducer, producer_config
from streams.reading import end_offset

LATENCY_PARTITIONS = 1
THROUGHPUT_PARTITIONS = 6
DISTINCT = 1000
"""Distinct keys (conversation ids) and records, cycled through."""
CIPHERTEXT_BYTES = 80
"""Sealed ciphertext size that makes each record's JSON value ~300 bytes."""
WARMUP = 100
"""Unmeasured records first: connections, metadata, the idempotent producer id."""
CONCURRENCY = 1000
"""Concurrent ``send`` callers in the Voice throughput figure (records in flight)."""
FETCH_WAIT_MAX_MS = 5
POLL_TIMEOUT_S = 10.0
SOURCE = "/voice/bench"
TENANT = "bench"


# --- the records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    keys: list[bytes]
    records: list[MessageRecorded]
    values: list[bytes]
    """``records[i].model_dump_json()``: the raw path's values, byte for byte Voice's values."""
    correlations: list[str]

    def envelope(self, i: int) -> Envelope:
        """The Voice envelope of record ``i`` (fresh id and time, as a producer makes it)."""
        j = i % DISTINCT
        rec = self.records[j]
        return Envelope(
            record=rec,
            key=rec.conversation,
            source=SOURCE,
            subject=rec.conversation,
            seq=i + 1,
            tenant=TENANT,
            correlation=self.correlations[j],
        )


@cache
def corpus() -> Corpus:
    """Deterministic records of realistic shape: a sealed message recorded in a conversation."""
    rng = random.Random(20240601)
    keys: list[bytes] = []
    records: list[MessageRecorded] = []
    correlations: list[str] = []
    for _ in range(DISTINCT):
        conversation = f"cnv-{rng.randbytes(8).hex()}"
        keys.append(conversation.encode())
        records.append(
            MessageRecorded(
                conversation=conversation,
                message_id=rng.randbytes(16).hex(),
                text=Sealed(
                    key_version=1,
                    nonce=base64.b64encode(rng.randbytes(12)).decode(),
                    ciphertext=base64.b64encode(rng.randbytes(CIPHERTEXT_BYTES)).decode(),
                ),
                at="2025-06-01T12:00:00.000000+00:00",
            )
        )
        correlations.append(rng.randbytes(16).hex())
    values = [r.model_dump_json().encode() for r in records]
    return Corpus(keys, records, values, correlations)


def raw_record_bytes(c: Corpus) -> float:
    return sum(len(k) + len(v) for k, v in zip(c.keys, c.values, strict=True)) / DISTINCT


def voice_record_bytes(c: Corpus, n: int) -> tuple[float, float]:
    """Mean (key + value, header) bytes of the envelopes a run of ``n`` records encodes."""
    sample = range(0, n, max(1, n // 1000))
    kv = hdr = 0
    for i in sample:
        key, value, headers = encode(c.envelope(i))
        kv += len(key) + len(value)
        hdr += sum(len(h) + len(v) for h, v in headers)
    return kv / len(sample), hdr / len(sample)


def encode_cost_us(n: int = 20_000) -> float:
    """CPU cost of building and encoding one Envelope, alone (no Kafka, one thread), in µs."""
    c = corpus()
    for i in range(1000):
        encode(c.envelope(i))
    t0 = time.perf_counter()
    for i in range(n):
        encode(c.envelope(i))
    return round((time.perf_counter() - t0) / n * 1e6, 3)


# --- clients ---------------------------------------------------------------------------------


def raw_producer(ctx: Context) -> Producer:
    """A confluent-kafka Producer with exactly the stack's settings (PRODUCER_CONFIG)."""
    return Producer(producer_config(ctx.settings))


def tail_consumer(ctx: Context, topic: str, partition: int = 0) -> Consumer:
    """A Consumer assigned to the end of ``topic``/``partition``, fetching with a short wait."""
    consumer = Consumer(
        {
            "bootstrap.servers": ctx.bootstrap,
            "group.id": f"voice-bench-{ctx.run_id}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
        }
    )
    high = end_offset(consumer, TopicPartition(topic, partition), 10)
    consumer.assign([TopicPartition(topic, partition, high)])
    return consumer


def broker_cpu_s(ctx: Context) -> float:
    """CPU seconds the run's local broker has used (0.0 on an existing cluster)."""
    used = cpu_seconds(ctx.broker_pid) if ctx.broker_pid else None
    return used or 0.0


def high_watermarks(ctx: Context, topic: str, partitions: int) -> int:
    """Sum of the partitions' high watermarks: records the broker holds (no duplicates)."""
    consumer = Consumer(
        {"bootstrap.servers": ctx.bootstrap, "group.id": f"voice-bench-{ctx.run_id}"}
    )
    try:
        return sum(
            end_offset(consumer, TopicPartition(topic, p), 10) for p in range(partitions)
        )
    finally:
        consumer.close()


def _produce(producer: Producer, topic: str, value: bytes, key: bytes, **kw: object) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, **kw)
            return
        except BufferError:  # local queue full: serve deliveries, then retry
            producer.poll(0.005)


@warmup
def warm_broker(ctx: Context) -> None:
    """Bring a cold broker (JIT, page cache, coordinators) to steady state: not measured.

    A throughput burst on a topic of its own, then sequential acks on the latency topic.
    """
    c = corpus()
    topic = ctx.topic("warmup", THROUGHPUT_PARTITIONS)
    producer = raw_producer(ctx)
    for _ in range(2):
        for i in range(ctx.throughput_records):
            _produce(producer, topic, c.values[i % DISTINCT], c.keys[i % DISTINCT])
        if producer.flush(60):
            raise RuntimeError("warm-up records not delivered")
    latency_topic = ctx.topic("latency", LATENCY_PARTITIONS)
    for i in range(1000):
        _produce(producer, latency_topic, c.values[i % DISTINCT], c.keys[i % DISTINCT])
        producer.flush(POLL_TIMEOUT_S)


# --- baselines -------------------------------------------------------------------------------


@benchmark("kafka.round_trip")
def round_trip(ctx: Context) -> Result:
    """Raw Kafka: produce one record → consumed by a tailing Consumer; sequential."""
    c = corpus()
    topic = ctx.topic("latency", LATENCY_PARTITIONS)
    producer = raw_producer(ctx)
    consumer = tail_consumer(ctx, topic)
    samples: list[float] = []
    skipped = 0
    broker0 = 0.0
    try:
        for i in range(WARMUP + ctx.records):
            if i == WARMUP:
                broker0 = broker_cpu_s(ctx)
            j = i % DISTINCT
            value, key = c.values[j], c.keys[j]
            t0 = time.perf_counter()
            _produce(producer, topic, value, key, partition=0)
            deadline = t0 + POLL_TIMEOUT_S
            while True:
                msg = consumer.poll(1.0)
                if msg is None:
                    if time.perf_counter() > deadline:
                        raise TimeoutError(f"record {i} not consumed within {POLL_TIMEOUT_S} s")
                    continue
                if msg.error() is not None:
                    raise RuntimeError(f"consumer error: {msg.error()}")
                if msg.value() == value:
                    break
                skipped += 1  # not ours (cannot happen on a fresh topic): keep waiting
            t1 = time.perf_counter()
            if i >= WARMUP:
                samples.append(t1 - t0)
            producer.poll(0)  # serve the delivery report
        broker_us = (broker_cpu_s(ctx) - broker0) * 1e6 / ctx.records
        if producer.flush(30):
            raise RuntimeError("round trip producer could not deliver everything")
    finally:
        consumer.close()
    return {
        **latency_summary(samples),
        # The broker's floor for one record produced alone and fetched by one consumer: a
        # produce request and a fetch answered (None on an existing cluster).
        "broker_cpu_us_per_record": round(broker_us, 1) if ctx.broker_pid else None,
        "record_bytes": round(raw_record_bytes(c), 1),
        "fetch_wait_max_ms": FETCH_WAIT_MAX_MS,
        "foreign_records_skipped": skipped,
    }


@benchmark("kafka.produce_ack")
def produce_ack(ctx: Context) -> Result:
    """Raw Kafka: produce one record → its delivery callback (acks=all); sequential."""
    c = corpus()
    topic = ctx.topic("latency", LATENCY_PARTITIONS)
    producer = raw_producer(ctx)
    samples: list[float] = []
    acked: list[KafkaError | None] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        acked.append(err)

    broker0 = 0.0
    for i in range(WARMUP + ctx.records):
        if i == WARMUP:
            broker0 = broker_cpu_s(ctx)
        j = i % DISTINCT
        acked.clear()
        t0 = time.perf_counter()
        _produce(producer, topic, c.values[j], c.keys[j], on_delivery=on_delivery)
        deadline = t0 + POLL_TIMEOUT_S
        while not acked:
            producer.poll(1.0)
            if not acked and time.perf_counter() > deadline:
                raise TimeoutError(f"record {i} not acked within {POLL_TIMEOUT_S} s")
        t1 = time.perf_counter()
        if acked[0] is not None:
            raise RuntimeError(f"delivery failed: {acked[0]}")
        if i >= WARMUP:
            samples.append(t1 - t0)
    broker_us = (broker_cpu_s(ctx) - broker0) * 1e6 / ctx.records
    producer.flush(30)
    return {**latency_summary(samples), "record_bytes": round(raw_record_bytes(c), 1),
            # The broker's floor for one produce request of one record, acks=all.
            "broker_cpu_us_per_record": round(broker_us, 1) if ctx.broker_pid else None}


def _raw_throughput_run(ctx: Context, topic: str, n: int) -> Result:
    c = corpus()
    keys, values = c.keys, c.values
    producer = raw_producer(ctx)
    for i in range(WARMUP):
        _produce(producer, topic, values[i % DISTINCT], keys[i % DISTINCT])
    if producer.flush(30):
        raise RuntimeError("warm-up records not delivered")
    before = high_watermarks(ctx, topic, THROUGHPUT_PARTITIONS)
    produce = producer.produce
    t0 = time.perf_counter()
    for i in range(n):
        j = i % DISTINCT
        try:
            produce(topic, value=values[j], key=keys[j])
        except BufferError:
            producer.poll(0.005)
            _produce(producer, topic, values[j], keys[j])
    left = producer.flush(60)
    elapsed = time.perf_counter() - t0
    if left:
        raise RuntimeError(f"{left} records still queued after flush")
    delivered = high_watermarks(ctx, topic, THROUGHPUT_PARTITIONS) - before
    if delivered != n:
        raise RuntimeError(f"broker holds {delivered} new records, {n} were produced")
    size = raw_record_bytes(c)
    return {
        "records_per_s": round(n / elapsed, 1),
        "mb_per_s": round(n * size / elapsed / 1e6, 3),
        "per_record_us": round(elapsed / n * 1e6, 3),
        "seconds": round(elapsed, 3),
    }


@benchmark("kafka.produce_throughput")
def produce_throughput(ctx: Context) -> Result:
    """Raw Kafka: N ~300-byte records through produce() then flush(); median of the runs."""
    topic = ctx.topic("throughput", THROUGHPUT_PARTITIONS)
    runs = []
    for r in range(ctx.runs):
        runs.append(_raw_throughput_run(ctx, topic, ctx.throughput_records))
        ctx.log(f"  raw run {r + 1}/{ctx.runs}: {runs[-1]['records_per_s']:.0f} records/s")
    best = median_run(runs, "records_per_s")
    return {
        "records_per_s": best["records_per_s"],
        "mb_per_s": best["mb_per_s"],
        "per_record_us": best["per_record_us"],
        "records": ctx.throughput_records,
        "partitions": THROUGHPUT_PARTITIONS,
        "record_bytes": round(raw_record_bytes(corpus()), 1),
        "header_bytes": 0,
        "runs": runs,
    }


# --- Voice figures ---------------------------------------------------------------------------


@benchmark(
    "voice.send_latency",
    baseline="kafka.produce_ack",
    compare=("p50_ms", "p99_ms", "mean_ms"),
)
def send_latency(ctx: Context) -> Result:
    """Voice: build an Envelope and ``await RecordProducer.send`` until acked; sequential."""
    c = corpus()
    topic = ctx.topic("latency", LATENCY_PARTITIONS)

    async def main() -> list[float]:
        producer = RecordProducer(ctx.settings)
        samples: list[float] = []
        try:
            for i in range(WARMUP + ctx.records):
                t0 = time.perf_counter()
                await asyncio.wait_for(producer.send(topic, c.envelope(i)), POLL_TIMEOUT_S)
                t1 = time.perf_counter()
                if i >= WARMUP:
                    samples.append(t1 - t0)
        finally:
            producer.close(30)
        return samples

    samples = asyncio.run(main())
    kv, hdr = voice_record_bytes(c, ctx.records)
    return {**latency_summary(samples), "record_bytes": round(kv, 1), "header_bytes": round(hdr, 1)}


async def _voice_throughput_run(ctx: Context, topic: str, n: int) -> Result:
    c = corpus()
    producer = RecordProducer(ctx.settings)
    try:
        await asyncio.gather(*(producer.send(topic, c.envelope(i)) for i in range(WARMUP)))
        before = high_watermarks(ctx, topic, THROUGHPUT_PARTITIONS)
        todo = iter(range(n))
        send, envelope = producer.send, c.envelope

        async def sender() -> None:
            for i in todo:
                await send(topic, envelope(i))

        t0 = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(min(CONCURRENCY, n))))
        elapsed = time.perf_counter() - t0
    finally:
        producer.close(30)
    delivered = high_watermarks(ctx, topic, THROUGHPUT_PARTITIONS) - before
    if delivered != n:
        raise RuntimeError(f"broker holds {delivered} new records, {n} were sent")
    kv, hdr = voice_record_bytes(c, n)
    return {
        "records_per_s": round(n / elapsed, 1),
        "mb_per_s": round(n * kv / elapsed / 1e6, 3),
        "wire_mb_per_s": round(n * (kv + hdr) / elapsed / 1e6, 3),
        "per_record_us": round(elapsed / n * 1e6, 3),
        "seconds": round(elapsed, 3),
    }


@benchmark(
    "voice.send_throughput",
    baseline="kafka.produce_throughput",
    compare=("records_per_s", "mb_per_s"),
)
def send_throughput(ctx: Context) -> Result:
    """Voice: the same records as Envelopes through ``RecordProducer.send``; median of runs."""
    topic = ctx.topic("throughput", THROUGHPUT_PARTITIONS)
    runs = []
    for r in range(ctx.runs):
        runs.append(asyncio.run(_voice_throughput_run(ctx, topic, ctx.throughput_records)))
        ctx.log(f"  voice run {r + 1}/{ctx.runs}: {runs[-1]['records_per_s']:.0f} records/s")
    best = median_run(runs, "records_per_s")
    kv, hdr = voice_record_bytes(corpus(), ctx.throughput_records)
    return {
        "records_per_s": best["records_per_s"],
        "mb_per_s": best["mb_per_s"],
        "wire_mb_per_s": best["wire_mb_per_s"],
        "per_record_us": best["per_record_us"],
        "encode_us_per_record": encode_cost_us(),
        "records": ctx.throughput_records,
        "partitions": THROUGHPUT_PARTITIONS,
        "concurrency": CONCURRENCY,
        "record_bytes": round(kv, 1),
        "header_bytes": round(hdr, 1),
        "runs": runs,
    }


def producer_settings() -> dict[str, object]:
    """PRODUCER_CONFIG as reported in the output (what every figure here produced with)."""
    return dict(PRODUCER_CONFIG)
