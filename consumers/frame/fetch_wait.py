"""How long the broker may hold a worker's fetch: ``VOICE_WORKER_FETCH_WAIT_MS``, not Faust's
fixed 1,500 ms.

aiokafka (under Faust) sends one fetch to a broker at a time, and leaves out of it every
partition whose fetched records still wait in its buffer for the worker's agents. Once those
records are taken, that partition's next records can only be asked for by the next fetch —
after the one in flight comes back. That one comes back when a record lands on one of *its*
partitions, or when the broker's wait (``fetch_max_wait_ms``) is over. Under a full load, when
every turn in flight waits on the worker, nothing lands anywhere else, and the worker stalls
for the whole wait: in ``turn.sustained`` (32 turns in flight) all 32 stopped at once for
~1.5 s, several times a run, making its p99 ~2.1 s against ~1 s without such a stall
(``docs/benchmarks.md``, "Issue 14, thirty-eighth pass"). Faust fixes the wait at 1,500 ms
(``AIOKafkaConsumerThread._create_worker_consumer``); ``hold_fetches_at_most`` sets the
worker's own.

The wait is not a latency otherwise: with ``fetch_min_bytes`` at 1, a record on any partition
of the fetch ends it at once. What a shorter wait costs is an idle worker's fetches: one each
wait instead of each 1.5 s.
"""

from __future__ import annotations

from typing import Any


def hold_fetches_at_most(consumer: Any, wait_ms: int) -> None:
    """Install on Faust's thread-delegating aiokafka consumer before it starts: the aiokafka
    consumer its thread makes lets the broker hold a fetch at most ``wait_ms``."""
    thread = consumer._thread
    make = thread._create_worker_consumer

    def _create_worker_consumer(transport: Any) -> Any:
        kafka = make(transport)
        kafka._fetch_max_wait_ms = wait_ms  # read when it starts and makes its fetcher
        return kafka

    thread._create_worker_consumer = _create_worker_consumer
