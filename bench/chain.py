"""A Voice turn's record flow on bare Kafka: what the broker itself allows for one turn here.

The issue's aim is a turn "close to what the broker itself allows". ``kafka.round_trip`` is one
hop; a turn is several hops and awaited acks in a row, and ~17 records. These two baselines play
the same flow with nothing but confluent-kafka, the stack's producer settings
(``streams.producer.PRODUCER_CONFIG``) and its tailing fetch settings (``streams.fetch``):

- ``kafka.turn_chain``: one turn at a time (as ``turn.overhead``): p50/p99 from the command's
  produce to its reply read back, and to its acknowledgement read back (the ``202``).
- ``kafka.turn_chain_sustained``: 32 conversations at once (as ``turn.sustained``): turns a
  second, and CPU a turn of the broker, the chain's worker and its edge.

Two roles. The *worker* (a process of its own, ``python -m bench.chain WORKER_ARGS``) consumes
the commands, conversation and workflow topics with one consumer and produces with one producer,
as a Voice worker does; the *edge* (in the bench process) produces each turn's command and tails
the conversation, ack and delta topics with one consumer, as Voice's edge does. What each hop
does is ``FLOW``: the records a Voice turn produces, topic by topic (``turn.sustained``'s
``records_per_turn_by_topic``: 16.3 a turn in issue 14's forty-second pass; 17 here), in
the order a turn produces them, each awaited
where Voice awaits it (``docs/benchmarks.md``, "Issue 14, seventeenth pass" names the four
acks a step awaits). No model, no HTTP, no decoding, no state, no offsets committed: every
cost left is the broker's and the clients' for the flow itself, with Python doing only a dict
look-up a hop.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition

from bench.broker_requests import per_unit, reading
from bench.harness import Context, Result, benchmark, latency_summary
from bench.stack import cpu_seconds, jit_cpu_seconds, own_cpu_seconds
from streams.fetch import TAILING, take
from streams.producer import PRODUCER_CONFIG

VALUE_BYTES = 700
"""A record's value (the recorded histories' records are ~700 bytes on average)."""
HEADERS = (("ce_specversion", b"1.0"), ("ce_source", b"/voice/bench-chain"),
           ("ce_time", b"2026-12-04T08:00:00.000000+00:00"),
           ("voice_tenant", b"bench"), ("voice_correlation", b"0" * 32),
           ("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"))
"""The CloudEvents and Voice headers a record carries beside its type, id and keys."""

SEQUENTIAL_TURNS = 200
SEQUENTIAL_WARMUP = 3000
CONCURRENCY = 32
SUSTAINED_WARMUP = 320
SUSTAINED_TURNS = 3000
PACED_RATES = (30.0, 100.0)
"""Turns a second of the paced runs: about what Voice sustains here, and the issue's target."""
PACED_SECONDS = 15.0
TURN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Out:
    """A record a hop produces: its topic, its type, and whether it is keyed by the
    conversation (``c``) or the turn (``t``)."""

    topic: str
    kind: str
    key: str


@dataclass(frozen=True)
class Stage:
    """Records produced together and awaited (``awaited``), then records produced and not
    awaited (``fired``); the hop's next stage starts on the last ack of this one's."""

    awaited: tuple[Out, ...]
    fired: tuple[Out, ...] = ()


def _o(spec: str) -> Out:
    topic, kind, key = spec.split("/")
    return Out(topic, kind, key)


FLOW: dict[tuple[str, str], tuple[Stage, ...]] = {
    # The writer: a message recorded (its turn opened), the table's changelog, the answer.
    ("commands", "send"): (
        Stage((_o("conversations/opened/c"),),
              (_o("conversations-changelog/cl/c"), _o("acks/ack/c"))),),
    # The turn starter: the turn's workflow started.
    ("conversations", "opened"): (Stage((_o("workflows/started/t"),)),),
    # The workflow agent: the step's lease, the table; the step (two model calls and a tool
    # call recorded, the display's delta, the telemetry record; drained), the results
    # command; then, in the step's own task, its outcome applied: the workflow completed, the
    # table (a turn's outcome has no record of its own: issue 14, forty-second pass).
    ("workflows", "started"): (
        Stage((_o("workflows/step_started/t"),), (_o("workflows-changelog/cl/t"),)),
        Stage((_o("agent/model/t"), _o("agent/tool/t"), _o("agent/model/t"),
               _o("deltas/delta/c"), _o("telemetry/t/t"))),
        Stage((_o("commands/results/c"),)),
        Stage((_o("workflows/completed/t"),), (_o("workflows-changelog/cl/t"),)),
    ),
    # The writer: the reply recorded, the table.
    ("commands", "results"): (
        Stage((_o("conversations/reply/c"),), (_o("conversations-changelog/cl/c"),)),),
}
"""What the worker does with each record it reads (by topic and type); a record not named
here (its own ``step_started``, ``completed``, ``reply``) is read and left, as Voice's agents
read every record of their topics."""

WORKER_READS = ("commands", "conversations", "workflows")
EDGE_READS = ("conversations", "acks", "deltas")
TOPICS = ("commands", "conversations", "acks", "workflows", "agent", "deltas", "telemetry",
          "conversations-changelog", "workflows-changelog")


def records_per_turn() -> int:
    """The records one turn produces: the command, and every record of ``FLOW``."""
    return 1 + sum(len(s.awaited) + len(s.fired) for stages in FLOW.values() for s in stages)


# --- the producing side, shared by both roles --------------------------------------------------


class Flow:
    """One producer; a delivery thread runs each stage's continuation on its last ack."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
        self.topics = topics
        self.value = os.urandom(VALUE_BYTES // 2).hex().encode()
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._deliver, name="chain-deliveries",
                                        daemon=True)
        self._thread.start()

    def _deliver(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.5)

    def close(self) -> None:
        self.producer.flush(10)
        self._stop.set()
        self._thread.join(2)
        del self.producer  # its threads go now, not at exit, after the broker has

    def produce(self, out: Out, conversation: bytes, turn: bytes, seq: int,
                then: Callable[[Any, Any], None] | None = None) -> None:
        key = conversation if out.key == "c" else turn
        kind = out.kind.encode()
        headers = [("ce_type", kind), ("ce_id", b"%s:%s:%d" % (turn, kind, seq)),
                   ("c", conversation), ("t", turn), *HEADERS]
        while True:
            try:
                self.producer.produce(self.topics[out.topic], value=self.value, key=key,
                                      headers=headers, on_delivery=then)
                return
            except BufferError:
                time.sleep(0.001)

    def run(self, stages: tuple[Stage, ...], conversation: bytes, turn: bytes) -> None:
        """Play ``stages`` in order, each after the acks of the one before."""
        if not stages:
            return
        stage, rest = stages[0], stages[1:]
        left = [len(stage.awaited)]
        lock = threading.Lock()

        def acked(err: Any, _msg: Any) -> None:
            if err is not None:
                self.errors += 1
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                for i, out in enumerate(stage.fired):
                    self.produce(out, conversation, turn, 100 + i)
                self.run(rest, conversation, turn)

        for i, out in enumerate(stage.awaited):
            self.produce(out, conversation, turn, i, acked)


def _headers(msg: Message) -> dict[str, bytes]:
    return dict(msg.headers() or ())


def _consumer(bootstrap: str, group: str, topics: list[str], partitions: int) -> Consumer:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "enable.partition.eof": False, **TAILING})
    c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(partitions)])
    return c


def topic_names(prefix: str) -> dict[str, str]:
    return {t: f"{prefix}{t}" for t in TOPICS}


# --- the worker (a process of its own) ---------------------------------------------------------


def worker_main(bootstrap: str, prefix: str, partitions: int) -> None:
    """Read the worker's topics from their start; play ``FLOW`` for each record named there."""
    topics = topic_names(prefix)
    flow = Flow(bootstrap, topics)
    consumer = _consumer(bootstrap, f"{prefix}worker", [topics[t] for t in WORKER_READS],
                         partitions)
    by_topic = {topics[t]: t for t in WORKER_READS}
    print("ready", flush=True)
    while True:
        for msg in take(consumer, 0.5):
            if msg.error() is not None:
                continue
            h = _headers(msg)
            stages = FLOW.get((by_topic[msg.topic()], h["ce_type"].decode()))
            if stages:
                flow.run(stages, h["c"], h["t"])


# --- the edge (in the bench process) -----------------------------------------------------------


class Edge:
    """Produces each conversation's next command once its reply is read back."""

    def __init__(self, ctx: Context, topics: dict[str, str], partitions: int) -> None:
        self.flow = Flow(ctx.bootstrap, topics)
        self.consumer = _consumer(ctx.bootstrap, f"{ctx.run_id}chain-edge",
                                  [topics[t] for t in EDGE_READS], partitions)
        self.replies = topics["conversations"]
        self.acks = topics["acks"]
        self.sent: dict[bytes, float] = {}
        self.accepted: list[float] = []
        self.replied: list[float] = []
        self.last_reply = 0.0
        self.left = 0
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tail, name="chain-tail", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.consumer.close()
        self.flow.close()

    def _send(self, conversation: bytes, n: int) -> None:
        turn = b"%s:turn-%d" % (conversation, n)
        self.sent[turn] = time.perf_counter()
        self.flow.produce(Out("commands", "send", "c"), conversation, turn, 0,
                          then=lambda err, _m: None)

    def _tail(self) -> None:
        while not self._stop.is_set():
            for msg in take(self.consumer, 0.2):
                if msg.error() is not None:
                    continue
                h = _headers(msg)
                kind, turn = h["ce_type"], h["t"]
                t0 = self.sent.get(turn)
                if t0 is None:
                    continue
                if msg.topic() == self.acks and kind == b"ack":
                    self.accepted.append(time.perf_counter() - t0)
                elif msg.topic() == self.replies and kind == b"reply":
                    self.last_reply = time.perf_counter()
                    self.replied.append(self.last_reply - self.sent.pop(turn))
                    self._next(h["c"], turn)

    def _next(self, conversation: bytes, turn: bytes) -> None:
        with self.cond:
            if self.left <= 0:
                self.cond.notify_all()
                return
            self.left -= 1
            n = int(turn.rsplit(b"-", 1)[1]) + 1
        self._send(conversation, n)

    def play(self, conversations: int, turns: int, label: str, rate: float | None = None
             ) -> float:
        """``turns`` turns over ``conversations`` at once, each sending on its last reply; or,
        at ``rate`` turns a second, each sent on time whatever came back (conversations in
        turn). The seconds from the first send to the last reply."""
        self.accepted.clear()
        self.replied.clear()
        first = turns if rate else min(conversations, turns)
        with self.cond:
            self.left = turns - first
        names = [b"cnv-%s-%s-%d" % (label.encode(), os.urandom(4).hex().encode(), i)
                 for i in range(conversations)]
        t0 = time.perf_counter()
        for i in range(first):
            if rate:
                time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            self._send(names[i % conversations], 1 + i // conversations)
        deadline = time.perf_counter() + TURN_TIMEOUT_S + turns * 0.05
        with self.cond:
            while len(self.replied) < turns:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{len(self.replied)} of {turns} chain turns replied")
                self.cond.wait(0.05)
        return self.last_reply - t0


# --- the benchmarks ----------------------------------------------------------------------------


@dataclass
class Chain:
    edge: Edge
    worker: subprocess.Popen[bytes]
    topics: dict[str, str]
    closed: bool = False

    def close(self) -> None:
        """Stop the edge, then the worker (twice is harmless)."""
        if self.closed:
            return
        self.closed = True
        self.edge.close()
        if self.worker.poll() is None:
            self.worker.terminate()
            try:
                self.worker.wait(10)
            except subprocess.TimeoutExpired:
                self.worker.kill()


_CHAINS: list[Chain] = []


def start_chain(ctx: Context, worker_module: str = "bench.chain") -> Chain:
    """A chain of its own: its topics (read from their start by the new worker), its worker
    process (``python -m worker_module``), its edge. The caller closes it (``Chain.close``)."""
    partitions = ctx.settings.topic_partitions
    base = f"chain{len(_CHAINS)}"
    topics = {t: ctx.topic(f"{base}.{t}", partitions) for t in TOPICS}
    prefix = topics["commands"].removesuffix("commands")
    worker = subprocess.Popen(
        [sys.executable, "-m", worker_module, ctx.bootstrap, prefix, str(partitions)],
        stdout=subprocess.PIPE)
    assert worker.stdout is not None
    if worker.stdout.readline().strip() != b"ready":
        worker.kill()
        raise RuntimeError("the chain's worker did not start")
    c = Chain(Edge(ctx, topics, partitions), worker, topics)
    _CHAINS.append(c)
    return c


def close_chains() -> None:
    """Close every chain still open (a benchmark that failed half way)."""
    for c in _CHAINS:
        with contextlib.suppress(Exception):
            c.close()


def _cpu(c: Chain, ctx: Context) -> dict[str, float | None]:
    """CPU seconds so far of the chain's worker, its edge (this process) and the broker
    (``broker_jit``: the part of it its JIT compiler ran)."""
    return {"chain_worker": cpu_seconds(c.worker.pid), "chain_edge": own_cpu_seconds(),
            "broker": cpu_seconds(ctx.broker_pid) if ctx.broker_pid else None,
            "broker_jit": jit_cpu_seconds(ctx.broker_pid) if ctx.broker_pid else None}


@benchmark("kafka.turn_chain")
def turn_chain(ctx: Context) -> Result:
    """Raw Kafka: a turn's records and awaited acks, one turn at a time; no model, no HTTP."""
    c = start_chain(ctx)
    try:
        # A broker still compiling makes each hop dearer (docs/benchmarks.md, fourth pass):
        # the turns at once first, as the stack's figures run after the broker has worked.
        c.edge.play(CONCURRENCY, SEQUENTIAL_WARMUP, "warm")
        c.edge.play(1, SEQUENTIAL_TURNS, "seq")
        return {**latency_summary(c.edge.replied), "accepted": latency_summary(c.edge.accepted),
                "records_per_turn": records_per_turn(), "produce_errors": c.edge.flow.errors}
    finally:
        c.close()


@benchmark("kafka.turn_chain_sustained")
def turn_chain_sustained(ctx: Context) -> Result:
    """Raw Kafka: a turn's records and acks over 32 conversations at once: turns/s, CPU."""
    c = start_chain(ctx)
    try:
        return _sustained(ctx, c)
    finally:
        c.close()


def _sustained(ctx: Context, c: Chain) -> Result:
    c.edge.play(CONCURRENCY, SUSTAINED_WARMUP, "warm")
    time.sleep(1.0)
    before, asked = _cpu(c, ctx), reading(ctx.broker_requests)
    elapsed = c.edge.play(CONCURRENCY, SUSTAINED_TURNS, "sus")
    cpu = _cpu_per_turn(before, _cpu(c, ctx), SUSTAINED_TURNS)
    result = {"turns": SUSTAINED_TURNS, "seconds": round(elapsed, 3),
              "turns_per_s": round(SUSTAINED_TURNS / elapsed, 1),
              "concurrency": CONCURRENCY, "turn_latency": latency_summary(c.edge.replied),
              "records_per_turn": records_per_turn(), "cpu_ms_per_turn": cpu,
              "broker_requests_per_turn": per_unit(asked, reading(ctx.broker_requests),
                                                   SUSTAINED_TURNS)}
    # The broker batches less the fewer turns come at once; at 30 turns/s most of its CPU a turn
    # was its JIT still compiling (`broker_jit`; issue 14, thirty-seventh pass).
    for rate in PACED_RATES:
        n = int(rate * PACED_SECONDS)
        before, asked = _cpu(c, ctx), reading(ctx.broker_requests)
        c.edge.play(CONCURRENCY, n, f"paced{rate:g}", rate=rate)
        result[f"at_{rate:g}_per_s"] = {
            "turns": n, "cpu_ms_per_turn": _cpu_per_turn(before, _cpu(c, ctx), n),
            "broker_requests_per_turn": per_unit(asked, reading(ctx.broker_requests), n),
            "turn_latency": latency_summary(c.edge.replied)}
    result["produce_errors"] = c.edge.flow.errors
    return result


def _cpu_per_turn(before: dict[str, float | None], after: dict[str, float | None], turns: int
                  ) -> dict[str, float | None]:
    return {name: None if b is None or after[name] is None
            else round((after[name] - b) * 1000 / turns, 2)  # type: ignore[operator]
            for name, b in before.items()}


if __name__ == "__main__":
    worker_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
