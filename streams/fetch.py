"""How Voice's own consumers fetch: the one setting of every consumer that follows a topic's
end (the edge's tail, the followers, the key store, the log reader), and the one way they take
what was fetched (``take``).

``fetch.wait.max.ms`` is how long the broker may hold a fetch that finds nothing new. It is
not a latency: with ``fetch.min.bytes`` at 1 a record appended to any partition of the fetch
ends the wait at once. It only sets how often an idle consumer asks again — and each fetch
names every partition the consumer reads, so at 5 ms (the edge's tail) or 50 ms (followers, key
stores) the broker spent much of its CPU answering "nothing new", more the more partitions
(``docs/benchmarks.md``, "Writer, POST path and fetch settings"). It must never hold anything
that changes what a consumer reads.

``fetch.queue.backoff.ms`` is how long librdkafka puts off a partition's next fetch once the
records it holds unread pass ``queued.min.messages`` or ``queued.max.messages.kbytes``: one
second by default. A consumer reading through history passes them every few fetches, and then
waits that second with its queue long drained: a windowed edge skipping 727,272 old records at
start was ready in 6.4 s at the default and 2.6 s at 10 ms, and its first read of an old
conversation took 2.1 s against 128 ms (issue 14, twenty-sixth pass). Every consumer of Voice
that reads more than it has just been sent sets it (``READING``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

IDLE_FETCH_WAIT_MS = 500
"""The broker holds a fetch with nothing new at most this long (librdkafka's default)."""

QUEUE_BACKOFF_MS = 10
"""librdkafka puts off a partition's next fetch this long when its unread records are over the
queue's bounds (its default: 1,000 ms, a second lost at each such pause)."""

READING: dict[str, object] = {"fetch.queue.backoff.ms": QUEUE_BACKOFF_MS}
"""The fetch setting of every consumer that may read more than its queue holds."""

TAILING: dict[str, object] = {
    "fetch.wait.max.ms": IDLE_FETCH_WAIT_MS,
    "fetch.min.bytes": 1,  # any record ends the broker's wait: no latency from the above
    **READING,  # a tail catching up reads through history first
}
"""The fetch settings of a consumer that follows a topic's end."""


def take(consumer: Consumer, wait: float, most: int = 500) -> list[Message]:
    """What ``consumer`` has fetched already, or else the first message to come within
    ``wait`` seconds with whatever came beside it; at most ``most``. A message may be an event
    (a partition's end, an error): the caller looks at ``error()``.

    Never ``consume(most, wait)``: librdkafka returns from it only once ``most`` messages have
    come or ``wait`` is over, so a lone record waited out the whole of ``wait`` — measured: a
    record produced 20 ms into ``consume(10_000, 0.1)`` came back at 100 ms, and every key a
    worker had not read yet cost a turn up to 100 ms (docs/benchmarks.md, "Issue 14, fifth
    pass")."""
    batch = consumer.consume(num_messages=most, timeout=0)
    if batch:
        return batch
    first = consumer.poll(wait)
    if first is None:
        return []
    return [first, *consumer.consume(num_messages=most - 1, timeout=0)] if most > 1 else [first]


def log_ends(admin: AdminClient, topic: str, partitions: Iterable[int],
             timeout: float) -> dict[int, int]:
    """Where each of ``partitions`` of ``topic`` ends now (its high watermark), in one
    ``ListOffsets`` request — not one (or two) per partition, as a consumer's
    ``get_watermark_offsets`` asks."""
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest()
                                  for p in partitions}, request_timeout=timeout)
    try:
        return {tp.partition: fut.result(timeout).offset for tp, fut in futures.items()}
    except TimeoutError:  # the broker's silence, as the client's own timeout says it
        raise KafkaException(KafkaError(
            KafkaError._TIMED_OUT, f"where {topic} ends: no answer in {timeout:.1f} s")) from None


class LogEnds:
    """``log_ends`` over an ``AdminClient`` kept between calls — and dropped when a request
    fails, then tried once more on a new one while time is left.

    A kept client's metadata outlives a broker restart: it names the partitions' old leader
    epochs, and librdkafka's admin client answered every later ``ListOffsets`` with
    ``FENCED_LEADER_EPOCH`` instead of looking again — an edge answered 503 for good after its
    broker came back (``test_the_edge_answers_503_with_retry_after_while_the_broker_is_down``).
    A new client fetches new metadata. A broker that is down fails the first try at its
    deadline, so that costs no second wait.
    """

    def __init__(self, bootstrap: str,
                 make: Callable[[dict[str, object]], AdminClient] = AdminClient) -> None:
        self._config: dict[str, object] = {"bootstrap.servers": bootstrap}
        self._make = make
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()

    def admin(self) -> AdminClient:
        """The kept client (a new one if none is kept)."""
        with self._lock:
            if self._admin is None:
                self._admin = self._make(self._config)
            return self._admin

    def drop(self) -> None:
        """Let the kept client go (librdkafka's threads go with the handle)."""
        with self._lock:
            self._admin = None

    def __call__(self, topic: str, partitions: Iterable[int], timeout: float) -> dict[int, int]:
        wanted = list(partitions)
        deadline = time.monotonic() + timeout
        try:
            return self._ask(topic, wanted, deadline)
        except Exception:
            if time.monotonic() >= deadline:
                raise
        return self._ask(topic, wanted, deadline)  # once more, on a new client

    def _ask(self, topic: str, wanted: list[int], deadline: float) -> dict[int, int]:
        admin = self.admin()
        try:
            return log_ends(admin, topic, wanted, max(0.1, deadline - time.monotonic()))
        except Exception:
            with self._lock:
                if self._admin is admin:  # not already replaced by another caller
                    self._admin = None
            raise
