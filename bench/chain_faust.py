"""The chain's worker on Faust: what a turn's record flow costs through the framework alone.

``kafka.turn_chain_sustained`` plays a turn's records with a bare confluent-kafka worker. This
is the same worker as a Voice worker is built: Faust agents consume the commands, conversation
and workflow topics (the settings of ``consumers.frame.context.faust_app`` that bear on it), the
records go out through one confluent-kafka producer with an asyncio face (one thread serving
deliveries, the futures of one ``poll`` resolved in one wake-up of the loop, as
``streams.producer.RecordProducer`` does), and the changelog records are Faust table writes.
Each record a worker acts on starts a task that plays its stages (``bench.chain.FLOW``), so
one turn's awaited acks never hold another's. Nothing else: no decoding, no model, no state
beyond one small value a table write.

``faust.turn_chain_sustained`` runs ``bench.chain``'s sustained figure with this worker; the
difference from ``kafka.turn_chain_sustained`` is what Faust and asyncio cost a turn, the floor
under any worker built on them.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import faust
from confluent_kafka import Producer

from bench.chain import FLOW, HEADERS, TOPICS, VALUE_BYTES, WORKER_READS, Out, Stage
from streams.producer import PRODUCER_CONFIG

CHANGELOGS = {"conversations-changelog": "conv", "workflows-changelog": "workflows"}
"""The chain's changelog records, as writes to these tables."""


class AsyncProducer:
    """A confluent-kafka producer whose ``produce`` returns a future of the record's ack."""

    def __init__(self, bootstrap: str, loop: asyncio.AbstractEventLoop) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})
        self.loop = loop
        self._done: list[asyncio.Future[None]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._deliver, name="chain-deliveries", daemon=True).start()

    def _deliver(self) -> None:
        while True:
            self.producer.poll(0.5)
            with self._lock:
                done, self._done = self._done, []
            if done:
                self.loop.call_soon_threadsafe(_resolve, done)

    def produce(self, topic: str, key: bytes, headers: list[tuple[str, bytes]],
                value: bytes) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self.loop.create_future()

        def acked(_err: Any, _msg: Any) -> None:
            with self._lock:
                self._done.append(fut)

        self.producer.produce(topic, value=value, key=key, headers=headers, on_delivery=acked)
        return fut


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for f in futures:
        if not f.done():
            f.set_result(None)


def faust_worker(bootstrap: str, prefix: str, partitions: int) -> faust.App:
    app = faust.App(f"{prefix}faust-worker".replace(".", "-"), broker=f"kafka://{bootstrap}",
                    store="memory://", topic_partitions=partitions, web_enabled=False,
                    consumer_auto_offset_reset="earliest", producer_acks=-1,
                    broker_commit_every=100, broker_commit_interval=0.5,
                    broker_session_timeout=10, broker_heartbeat_interval=2,
                    stream_wait_empty=False)
    names = {t: f"{prefix}{t}" for t in TOPICS}
    tables = {name: app.Table(name, default=None, partitions=partitions)
              for name in CHANGELOGS.values()}
    value = b"v" * VALUE_BYTES
    state: dict[str, AsyncProducer] = {}

    def send(out: Out, conversation: bytes, turn: bytes, seq: int) -> asyncio.Future[None]:
        kind = out.kind.encode()
        headers = [("ce_type", kind), ("ce_id", b"%s:%s:%d" % (turn, kind, seq)),
                   ("c", conversation), ("t", turn), *HEADERS]
        key = conversation if out.key == "c" else turn
        return state["producer"].produce(names[out.topic], key, headers, value)

    async def play(stages: tuple[Stage, ...], conversation: bytes, turn: bytes,
                   event: Any) -> None:
        """``event`` is held so that Faust's ``current_event`` (a weak reference) still names
        it when a table is written: the changelog record goes to its partition."""
        for stage in stages:
            await asyncio.gather(*(send(o, conversation, turn, i)
                                   for i, o in enumerate(stage.awaited)))
            for i, out in enumerate(stage.fired):
                if out.topic in CHANGELOGS:
                    key = (conversation if out.key == "c" else turn).decode()
                    tables[CHANGELOGS[out.topic]][key] = {"seq": i}
                else:
                    send(out, conversation, turn, 100 + i)

    tasks: set[asyncio.Task[None]] = set()

    def agent_of(base: str) -> Any:
        async def agent(stream: Any) -> None:
            if "producer" not in state:
                state["producer"] = AsyncProducer(bootstrap, asyncio.get_running_loop())
            async for event in stream.events():
                h = dict(event.headers or ())
                stages = FLOW.get((base, h["ce_type"].decode()))
                if stages:
                    task = asyncio.ensure_future(play(stages, h["c"], h["t"], event))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        agent.__name__ = agent.__qualname__ = f"chain_{base}"
        return agent

    for base in WORKER_READS:
        topic = app.topic(names[base], key_type=bytes, value_type=bytes, key_serializer="raw",
                          value_serializer="raw", partitions=partitions)
        app.agent(topic, name=f"chain_{base}")(agent_of(base))
    return app


def main(bootstrap: str, prefix: str, partitions: int) -> None:
    from faust.worker import Worker

    app = faust_worker(bootstrap, prefix, partitions)
    print("ready", flush=True)  # the edge's first turn waits for the group to settle
    worker = Worker(app, loglevel="warning", quiet=True)
    worker.spinner = None
    worker.execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
