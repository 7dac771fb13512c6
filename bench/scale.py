"""Scale-out figures (issue 14): more worker processes, and an edge's start with a long log.

* ``scale.one_worker`` (baseline) and ``scale.workers``: sustained turns (as ``turn.sustained``:
  32 participants, each holding its SSE stream, simulator at 0 ms) on a stack of its own whose
  topics have ``PARTITIONS`` partitions, with 1 worker process, then 2, then 3. Each stack is
  fresh (its own topics and groups), so a run never inherits the previous one's state. The
  figure is turns per CPU-second of the processes that do the work (edge, workers, broker):
  how much each added worker costs, not how much it adds — on 2 cores, more processes cannot
  add throughput, they can only share it. ``scale.workers`` reports the worst of 2 and 3
  workers beside the one-worker baseline of the same run, and every count in ``by_workers``.
  0 lost and 0 duplicated replies are counted (``bench.turns.outcomes``), not assumed.
* ``edge.start_empty`` (baseline) and ``edge.start_with_history``: an edge process started on
  topics with no records, then on topics holding ``VOICE_BENCH_HISTORY`` (default 1,000,000)
  conversation records as the sequencer writes them; time from spawn to ``/readyz`` 200 and
  the edge's RSS once ready. No worker runs: the edge only reads.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import shutil
import time
from typing import Any

from confluent_kafka import Producer

from bench.fanout import rss_kib
from bench.harness import Context, Result, benchmark
from bench.settings import BenchSettings
from bench.stack import BENCH_QUOTAS, Stack, cpu_seconds, stack_settings, start_stack
from bench.turns import _cpu_delta, _headers, _sustained_run, outcomes
from deploy.kafka_local import free_port
from deploy.processes import spawn_voice, stop, wait_http_ready
from schemas.base import Record, Sealed
from schemas.conversation import (
    ConversationStarted,
    MessageRecorded,
    ReplyRecorded,
    TurnRequested,
    TurnStateChanged,
)
from streams.envelope import Envelope, encode
from streams.ids import turn_id
from streams.producer import PRODUCER_CONFIG
from streams.topics import CONVERSATIONS, create_topics, topic_name

PARTITIONS = 12
WORKER_COUNTS = (2, 3)
"""Worker processes of ``scale.workers``, beside the baseline's one."""
SCALE_TURNS = 300
SCALE_WARMUP = 32
SCALE_CONCURRENCY = 32
HISTORY = int(os.environ.get("VOICE_BENCH_HISTORY", "1000000"))
TURNS_PER_CONVERSATION = 2
"""A conversation of the history: started, then this many turns of five records each
(message, turn requested, thinking, reply, replied)."""
RECORDS_PER_CONVERSATION = 1 + 5 * TURNS_PER_CONVERSATION
CIPHERTEXT_BYTES = 80
"""As ``bench.kafka_baseline``: a short sealed message (a record's value is ~300 bytes)."""
EDGE_READY_TIMEOUT_S = 600.0
"""Generous: the edge reads the whole log before it is ready (the thing measured)."""
TENANT = "default"
OWNER = "bench-history"


# --- scale.one_worker / scale.workers ---------------------------------------------------------


def _worker_run(ctx: Context, workers: int) -> Result:
    """Sustained turns on a fresh ``PARTITIONS``-partition stack with ``workers`` workers."""
    st = start_stack(ctx, f"scale{workers}", workers=workers, partitions=PARTITIONS)
    try:
        return _measure(ctx, st, workers)
    finally:
        st.close()


def _measure(ctx: Context, st: Stack, workers: int) -> Result:
    h = _headers(ctx, f"bench-scale{workers}")
    asyncio.run(_sustained_run(st, h, SCALE_WARMUP, SCALE_CONCURRENCY))  # unmeasured
    cpu0 = st.cpu()
    elapsed, parts, _latencies = asyncio.run(
        _sustained_run(st, h, SCALE_TURNS, SCALE_CONCURRENCY))
    cpu1 = st.cpu()
    n = sum(len(p.turns) for p in parts)
    working = [name for name in cpu1 if name == "edge" or name == "broker"
               or name.startswith("worker")]
    spent = {name: (cpu1[name] or 0.0) - (cpu0[name] or 0.0) for name in working
             if cpu1[name] is not None and cpu0[name] is not None}
    cpu_s = sum(spent.values())
    return {
        "workers": workers, "turns": n, "seconds": round(elapsed, 3),
        "turns_per_s": round(n / elapsed, 1),
        "cpu_s": round(cpu_s, 2),
        "turns_per_cpu_s": round(n / cpu_s, 2) if cpu_s else None,
        "cpu_counted": sorted(spent),
        "cpu_ms_per_turn": _cpu_delta(cpu0, cpu1, n),
        **outcomes(st.settings, parts),
        "stack": st.describe(),
    }


def _check(result: Result) -> None:
    """A run that lost or duplicated a reply is no figure."""
    if result["lost_replies"] or result["duplicated_replies"]:
        raise RuntimeError(f"{result['workers']} workers: {result['lost_replies']} lost, "
                           f"{result['duplicated_replies']} duplicated replies")


@benchmark("scale.one_worker")
def one_worker(ctx: Context) -> Result:
    """Sustained turns per CPU-second with 1 worker on 12 partitions (scale-out baseline)."""
    result = _worker_run(ctx, 1)
    _check(result)
    return result


@benchmark("scale.workers", baseline="scale.one_worker",
           compare=("turns_per_cpu_s", "turns_per_s"))
def more_workers(ctx: Context) -> Result:
    """Sustained turns per CPU-second with 2 and 3 workers on 12 partitions (the worst)."""
    runs = {str(n): _worker_run(ctx, n) for n in WORKER_COUNTS}
    for r in runs.values():
        _check(r)
    worst = min(runs.values(), key=lambda r: r["turns_per_cpu_s"] or 0.0)
    # One worker again, last: the baseline ran first on a colder broker and machine; if this
    # one differs from it as much as the figure does, the difference is drift, not workers.
    again = _worker_run(ctx, 1)
    _check(again)
    return {
        "turns_per_cpu_s": worst["turns_per_cpu_s"], "turns_per_s": worst["turns_per_s"],
        "worst_workers": worst["workers"],
        "lost_replies": sum(r["lost_replies"] for r in runs.values()),
        "duplicated_replies": sum(r["duplicated_replies"] for r in runs.values()),
        "by_workers": runs,
        "one_worker_again": {k: again[k] for k in ("turns_per_s", "turns_per_cpu_s",
                                                   "cpu_ms_per_turn", "lost_replies",
                                                   "duplicated_replies")},
        "note": f"{os.cpu_count()} cores: more worker processes share the same cores, so "
                "turns/s cannot grow with them; turns per CPU-second (edge + workers + "
                "broker) is the figure — what scaling out costs",
    }


# --- edge.start_empty / edge.start_with_history ---------------------------------------------


def _sealed(rng: random.Random) -> Sealed:
    return Sealed(key_version=1, nonce=base64.b64encode(rng.randbytes(12)).decode(),
                  ciphertext=base64.b64encode(rng.randbytes(CIPHERTEXT_BYTES)).decode())


def conversation_records(conversation: str, rng: random.Random) -> list[Record]:
    """One conversation's log as the sequencer appends it (seq = position + 1): started, then
    ``TURNS_PER_CONVERSATION`` turns that each end ``Replied``."""
    out: list[Record] = [ConversationStarted(conversation=conversation, owner=OWNER)]
    for t in range(TURNS_PER_CONVERSATION):
        msg_seq = 2 + 5 * t
        turn = turn_id(conversation, msg_seq)
        out += [
            MessageRecorded(conversation=conversation, message_id=rng.randbytes(16).hex(),
                            text=_sealed(rng), at="2026-06-01T12:00:00.000000+00:00"),
            TurnRequested(conversation=conversation, turn=turn, message_seq=msg_seq),
            TurnStateChanged(conversation=conversation, turn=turn, state="Thinking"),
            ReplyRecorded(conversation=conversation, turn=turn,
                          reply_id=rng.randbytes(16).hex(), text=_sealed(rng)),
            TurnStateChanged(conversation=conversation, turn=turn, state="Replied"),
        ]
    return out


def produce_history(bootstrap: str, topic: str, records: int, seed: int = 14) -> int:
    """Produce about ``records`` conversation records (whole conversations, the real envelope
    and encoder) onto ``topic``; returns how many were produced, all acked."""
    rng = random.Random(seed)
    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": bootstrap,
                         "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000})
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    produced = 0
    for _ in range(max(1, records // RECORDS_PER_CONVERSATION)):
        conversation = f"cnv-{rng.randbytes(8).hex()}"
        for seq, rec in enumerate(conversation_records(conversation, rng), start=1):
            key, value, headers = encode(Envelope(
                record=rec, key=conversation, source="/voice/sequencer", seq=seq,
                tenant=TENANT, subject=conversation))
            while True:
                try:
                    producer.produce(topic, value, key, headers=headers,
                                     on_delivery=on_delivery)
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.05)
            produced += 1
        producer.poll(0)
    left = producer.flush(300)
    if left or failed:
        raise RuntimeError(f"history: {left} records unsent, {len(failed)} failed "
                           f"({failed[:3]})")
    return produced


def _edge_start(ctx: Context, label: str, history: int) -> Result:
    """An edge spawned on fresh topics holding ``history`` conversation records: seconds to
    ``/readyz`` 200 and its RSS once ready (and after a short settle)."""
    settings = stack_settings(ctx, label)
    try:
        create_topics(settings)
        produced, produce_s = 0, 0.0
        if history:
            t0 = time.perf_counter()
            produced = produce_history(settings.bootstrap,
                                       topic_name(settings, CONVERSATIONS), history)
            produce_s = time.perf_counter() - t0
            ctx.log(f"  {produced} history records produced in {produce_s:.1f} s")
        port = free_port()
        t0 = time.perf_counter()
        edge = spawn_voice(settings, "edge", "--port", str(port),
                           log=settings.state_dir / "edge.log", **BENCH_QUOTAS)
        try:
            wait_http_ready(f"http://127.0.0.1:{port}/readyz", timeout=EDGE_READY_TIMEOUT_S,
                            proc=edge)
            ready_s = time.perf_counter() - t0
            rss_ready = rss_kib(edge.pid)
            cpu = cpu_seconds(edge.pid)
            time.sleep(2.0)
            rss_settled = rss_kib(edge.pid)
        finally:
            stop(edge)
    finally:
        if not BenchSettings().keep_state:
            shutil.rmtree(settings.state_dir, ignore_errors=True)
    return {
        "history_records": produced,
        "conversations": produced // RECORDS_PER_CONVERSATION,
        "ready_s": round(ready_s, 2),
        "rss_mib": round(rss_ready / 1024, 1),
        "rss_after_2s_mib": round(rss_settled / 1024, 1),
        "cpu_s_to_ready": round(cpu, 2) if cpu is not None else None,
        "history_produce_s": round(produce_s, 1),
        "topic_partitions": settings.topic_partitions,
    }


@benchmark("edge.start_empty")
def start_empty(ctx: Context) -> Result:
    """An edge on empty topics: seconds to /readyz ready, and its RSS then (the floor)."""
    return _edge_start(ctx, "startempty", 0)


@benchmark("edge.start_with_history", baseline="edge.start_empty",
           compare=("ready_s", "rss_mib"))
def start_with_history(ctx: Context) -> Result:
    """An edge on a log of VOICE_BENCH_HISTORY conversation records: ready time and RSS."""
    return _edge_start(ctx, "starthistory", HISTORY)
