"""The key service's figures (issue 10), each beside a baseline measured in the same run.

* ``keys.lookup_cached`` beside ``python.dict_get``: what sealing on the POST path asks of the
  key store — ``create`` (a live key: its version) then ``get`` — for a key already unwrapped,
  timed one call pair at a time over 10,000 ids; the baseline is a plain ``dict`` lookup of a
  32-byte value timed the same way (so the timer's own cost is in both).
* ``keys.ready_100k`` beside ``kafka.read_100k``: a new process's key store reading 100,000
  wrapped keys from the key topic until ready; the baseline is a plain consumer reading the same
  100,000 records to the end. The ratio is the cost of folding records into the ring (parsing,
  no unwrapping: keys are unwrapped at their first use).
"""

from __future__ import annotations

import os
import random
import secrets
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.harness import Context, Result, benchmark, latency_summary
from streams.envelope import Envelope, encode
from streams.kek import MasterKek
from streams.keyring import wrap_record
from streams.keyservice import SOURCE, ClusterKeyStore
from streams.settings import VoiceSettings
from streams.topics import KEYS, topic_name

LOOKUP_IDS = 10_000
LOOKUPS = 200_000
READY_KEYS = 100_000
MASTER = os.urandom(32)


def _keys_settings(ctx: Context, name: str) -> VoiceSettings:
    """Settings whose key topic is this run's own (created here, deleted with the run)."""
    settings = ctx.settings.model_copy(update={
        "topic_prefix": f"{ctx.settings.topic_prefix}voice.bench.{ctx.run_id}.{name}."})
    topic = topic_name(settings, KEYS)
    admin = AdminClient({"bootstrap.servers": ctx.bootstrap})
    new = NewTopic(topic, num_partitions=settings.topic_partitions,
                   replication_factor=settings.replication_factor, config=KEYS.config())
    admin.create_topics([new], operation_timeout=30)[topic].result(timeout=60)
    ctx.created_topics.append(topic)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = admin.list_topics(topic, timeout=10).topics.get(topic)
        if t is not None and not t.error and all(p.leader >= 0 for p in t.partitions.values()):
            break
        time.sleep(0.1)
    return settings


def _fill(settings: VoiceSettings, n: int) -> None:
    """``n`` wrapped keys on the key topic, as ``n`` creations would leave them."""
    kek = MasterKek(MASTER)
    producer = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 20,
                         "queue.buffering.max.messages": 200_000})
    topic = topic_name(settings, KEYS)
    for i in range(n):
        id_ = f"cnv-{i:016x}"
        rec = wrap_record(kek, id_, os.urandom(32), secrets.token_hex(16), 1, tenant="bench")
        k, v, h = encode(Envelope(record=rec, key=id_, source=SOURCE, subject=id_,
                                  tenant="bench"))
        while True:
            try:
                producer.produce(topic, key=k, value=v, headers=h)
                break
            except BufferError:
                producer.poll(0.5)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the key records were not all acknowledged")


# --- lookups --------------------------------------------------------------------------------


def _timed(fn, ids: list[str]) -> list[float]:  # noqa: ANN001
    clock = time.perf_counter
    samples = []
    for id_ in ids:
        t0 = clock()
        fn(id_)
        samples.append(clock() - t0)
    return samples


def _order(ids: list[str]) -> list[str]:
    rng = random.Random(7)
    return [rng.choice(ids) for _ in range(LOOKUPS)]


@benchmark("python.dict_get")
def dict_get(ctx: Context) -> Result:
    """A plain dict lookup of a 32-byte value, timed one at a time (the floor)."""
    table = {f"cnv-{i:016x}": os.urandom(32) for i in range(LOOKUP_IDS)}
    return latency_summary(_timed(table.__getitem__, _order(list(table))), digits=5)


@benchmark("keys.lookup_cached", baseline="python.dict_get", compare=("p50_ms", "p99_ms"))
def lookup_cached(ctx: Context) -> Result:
    """The POST path's key lookups (create → version, get → key) of an unwrapped key."""
    settings = _keys_settings(ctx, "lookup")
    _fill(settings, LOOKUP_IDS)
    store = ClusterKeyStore(settings, MasterKek(MASTER))
    try:
        store.wait_ready(60)
        store.sync(60)
        ids = store.ring.live_ids()
        for id_ in ids:  # unwrapped once, as the first seal or open of each id does
            store.get(id_, 1)

        def lookup(id_: str) -> None:
            store.get(id_, store.create(id_))

        out = latency_summary(_timed(lookup, _order(ids)), digits=5)
    finally:
        store.close()
    return {**out, "ids": len(ids)}


# --- a new process reading 100,000 keys -------------------------------------------------------


@benchmark("kafka.read_100k")
def read_100k(ctx: Context) -> Result:
    """A plain consumer reading the 100,000 records of a key topic to its end."""
    settings = _ready_topic(ctx)
    topic = topic_name(settings, KEYS)
    t0 = time.perf_counter()
    c = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    eof: set[int] = set()
    read = 0
    while eof != set(parts):
        for msg in c.consume(num_messages=10_000, timeout=0.1):
            if msg.error() is None:
                read += 1
            elif msg.error().code() == KafkaError._PARTITION_EOF:
                eof.add(msg.partition())
    seconds = time.perf_counter() - t0
    c.close()
    return {"seconds": round(seconds, 3), "records": read}


@benchmark("keys.ready_100k", baseline="kafka.read_100k", compare=("seconds",))
def ready_100k(ctx: Context) -> Result:
    """A new key store (as in a starting edge or worker) ready with 100,000 keys."""
    settings = _ready_topic(ctx)
    t0 = time.perf_counter()
    store = ClusterKeyStore(settings, MasterKek(MASTER))
    try:
        store.wait_ready(120)
        seconds = time.perf_counter() - t0
        keys = len(store.ring)
    finally:
        store.close()
    return {"seconds": round(seconds, 3), "keys": keys, "bound_s": 5.0,
            "within_bound": seconds <= 5.0}


_READY: dict[str, VoiceSettings] = {}


def _ready_topic(ctx: Context) -> VoiceSettings:
    """The run's topic of 100,000 keys, filled once for both of its benchmarks."""
    if ctx.run_id not in _READY:
        settings = _keys_settings(ctx, "ready")
        ctx.log(f"writing {READY_KEYS} wrapped keys")
        _fill(settings, READY_KEYS)
        _READY[ctx.run_id] = settings
    return _READY[ctx.run_id]
