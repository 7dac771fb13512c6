"""The one Kafka producer setup every Voice process uses (edge, workers, CLI, benchmarks).

``PRODUCER_CONFIG`` is what the stack produces with; the benchmark baseline uses it too, so a
ratio against it measures Voice, not a differently tuned client. ``Publisher`` is the one produce
helper: records by topic spec (the settings' prefix applied), one, or many in order.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from streams.envelope import Envelope, Headers, encode
from streams.settings import VoiceSettings
from streams.topics import TopicSpec, topic_name

log = logging.getLogger(__name__)

PRODUCER_CONFIG: dict[str, object] = {
    # Durable and ordered per partition; retries never duplicate or reorder.
    "acks": "all",
    "enable.idempotence": True,
    "max.in.flight.requests.per.connection": 5,
    # A request path waits on the ack: send at once. librdkafka still batches what queues up
    # while a request is in flight; 1 ms of linger cost every awaited produce ~1.2 ms (the raw
    # ack 1.42 → 0.23 ms, the round trip 1.52 → 0.33 ms) and bought no throughput
    # (docs/benchmarks.md, "Issue 14, fifth pass").
    "linger.ms": 0,
    "compression.type": "lz4",
    # The Java client's partitioner, so a key lands where Kafka Streams, Faust (aiokafka) and
    # any other Kafka client would put it: co-partitioning holds across producers.
    "partitioner": "murmur2_random",
}


class ProduceError(Exception):
    """The broker did not take a record; ``retryable`` says whether trying again may help,
    ``code`` is the client's error code when it gave one. Its message is the client's or
    Voice's (topics, sizes, codes), never a record's content."""

    plain_message = True

    def __init__(self, message: str, retryable: bool, code: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.code = code

    @property
    def too_large(self) -> bool:
        """The record is over the size the client or the broker takes."""
        return self.code == KafkaError.MSG_SIZE_TOO_LARGE


class RecordTooLarge(ProduceError):
    """A record over the size it may be produced at; it was never sent (not retryable)."""

    def __init__(self, topic: str, size: int, limit: int, key: object = None) -> None:
        of = f"{topic!r}" if key is None else f"{topic!r} (key {key!r})"
        super().__init__(f"a record of {size} bytes for {of} is over the limit of {limit} "
                         "bytes (VOICE_MAX_RECORD_BYTES)", retryable=False,
                         code=KafkaError.MSG_SIZE_TOO_LARGE)
        self.topic, self.size, self.limit = topic, size, limit


def too_large(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal of a record as too large — by Voice's bound, the client's
    ``message.max.bytes`` (raised at ``produce``) or the topic's ``max.message.bytes`` (in
    the delivery report): sending it again cannot help."""
    if isinstance(exc, ProduceError):
        return exc.too_large
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and err.code() == KafkaError.MSG_SIZE_TOO_LARGE


def record_size(key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    """Bytes of a record as the client sends it, before compression: key, value, headers.

    The broker's ``max.message.bytes`` counts a batch (compressed, plus tens of bytes of
    framing), so a record within a limit this measures, set below the broker's, always fits.
    """
    size = len(key or b"") + len(value or b"")
    return size + sum(len(k.encode()) + len(v or b"") for k, v in headers or ())


def producer_config(settings: VoiceSettings, **extra: object) -> dict[str, object]:
    return {"bootstrap.servers": settings.bootstrap, **PRODUCER_CONFIG, **extra}


class RecordProducer:
    """A confluent-kafka producer with an asyncio face: ``await send(...)`` returns on the ack.

    A daemon thread serves delivery callbacks so the event loop never blocks on ``poll``. The
    acks one ``poll`` serves reach each event loop in one hop, not one per record: a
    ``call_soon_threadsafe`` wakes the loop through its self-pipe (a syscall on each side),
    and at a turn's ~17 records it was 5 % of a worker's samples (docs/benchmarks.md).
    With ``wait_when_full`` (the default) a full local queue is waited out; without it,
    ``produce_raw`` raises the client's ``BufferError`` at once (the edge answers 503).

    Every record of every process passes ``produce_raw``, so this is where the record bound
    holds: a record over ``VOICE_MAX_RECORD_BYTES`` (set below the broker's
    ``max.message.bytes``) raises ``RecordTooLarge`` and is never sent. Its caller fails
    that one record (a step fails and its turn ends with the reason, a command is
    dead-lettered); nothing the broker would refuse later can reach it.
    """

    def __init__(self, settings: VoiceSettings, *, wait_when_full: bool = True,
                 **extra: object) -> None:
        self._producer = Producer(producer_config(settings, **extra))
        self._wait_when_full = wait_when_full
        self.max_bytes = settings.max_record_bytes
        self._stop = threading.Event()
        self._settled: list[_Settled] = []
        self._settled_lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="voice-producer", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)
            self._hand_over()

    def _hand_over(self) -> None:
        """Send the outcomes the last ``poll`` or ``flush`` collected to their loops, one
        hop per loop, in delivery order."""
        with self._settled_lock:
            settled, self._settled = self._settled, []
        if not settled:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[_Settled]] = {}
        for item in settled:
            by_loop.setdefault(item[0], []).append(item)
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, batch)
            except RuntimeError:  # that loop is closed: nobody is left to wait on these
                log.debug("dropped %d delivery reports of a closed loop", len(batch))

    def produce_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Message]:
        """Produce bytes; the future resolves with the delivered message (or ProduceError).

        ``RecordTooLarge`` (raised here, nothing sent) for a record over ``max_bytes``."""
        if (size := record_size(key, value, headers)) > self.max_bytes:
            raise RecordTooLarge(topic, size, self.max_bytes)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Message] = loop.create_future()

        lock = self._settled_lock

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            exc = None if err is None else ProduceError(
                f"produce to {topic!r} failed: {err.str()}", err.retriable(), err.code())
            with lock:
                self._settled.append((loop, fut, msg, exc))

        kwargs: dict[str, object] = {"key": key, "value": value, "on_delivery": on_delivery}
        if headers:
            kwargs["headers"] = list(headers)
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                if not self._wait_when_full:
                    raise
                self._producer.poll(0.01)
                self._hand_over()
        return fut

    async def send(self, topic: str, env: Envelope) -> Message:
        """Produce one record and wait for the broker's ack."""
        key, value, headers = encode(env)
        return await self.produce_raw(topic, key, value, headers)

    def flush(self, timeout: float = 10.0) -> int:
        left = self._producer.flush(timeout)
        self._hand_over()
        return left

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued, then stop the callback thread."""
        self._producer.flush(timeout)
        self._stop.set()
        self._thread.join(timeout=1.0)
        self._hand_over()
        # Drop the client now: librdkafka's threads live until the handle is destroyed and
        # would keep reconnecting to a broker that may be gone.
        del self._producer


class Publisher:
    """Produces envelopes to registered topics: the one produce helper of every process.

    ``producer`` is a callable so a worker can create its producer lazily inside its own
    event loop; pass ``lambda: p`` for one that exists already.
    """

    def __init__(self, settings: VoiceSettings, producer: Callable[[], RecordProducer]) -> None:
        self.settings = settings
        self._producer = producer

    @property
    def producer(self) -> RecordProducer:
        return self._producer()

    def produce(self, spec: TopicSpec, env: Envelope, max_bytes: int | None = None
                ) -> asyncio.Future[Message]:
        """Produce now; the returned future resolves on the broker's ack. A record over
        ``max_bytes`` (``record_size``) raises ``RecordTooLarge`` and is not produced."""
        key, value, headers = encode(env)
        topic = topic_name(self.settings, spec)
        if max_bytes is not None and (size := record_size(key, value, headers)) > max_bytes:
            raise RecordTooLarge(topic, size, max_bytes)
        return self._producer().produce_raw(topic, key, value, headers)

    async def send(self, spec: TopicSpec, env: Envelope, max_bytes: int | None = None
                   ) -> Message:
        """Produce one record and wait for the broker's ack (``max_bytes`` as ``produce``)."""
        return await self.produce(spec, env, max_bytes)

    async def send_all(self, items: Sequence[tuple[TopicSpec, Envelope]]) -> None:
        """Produce in order (one partition per key keeps it), then wait for every ack."""
        await deliver_all(self.produce, items)


async def deliver_all(produce: Callable[[TopicSpec, Envelope], Awaitable[object]],
                      items: Sequence[tuple[TopicSpec, Envelope]]) -> list[object]:
    """Produce ``items`` in order, then wait until every one has settled; raise the first
    failure (a produce the client refused at once stops the rest), the others retrieved.
    Returns each one's delivery report (what ``produce`` resolved to), in order."""
    pending: list[asyncio.Future[object]] = []
    refused: BaseException | None = None
    for spec, env in items:
        try:
            pending.append(asyncio.ensure_future(produce(spec, env)))
        except (KafkaException, ProduceError) as exc:  # refused before sending: too large
            refused = exc
            break
    results = await asyncio.gather(*pending, return_exceptions=True)
    failure = refused or next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure
    return list(results)


_Settled = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Message]", Message,
                 BaseException | None]
"""One delivery report on its way to its loop: (loop, future, message, failure or None)."""


def _settle(batch: list[_Settled]) -> None:
    """On the future's loop: resolve each future of ``batch`` (one a caller gave up on,
    cancelled, is left as it is)."""
    for _, fut, msg, exc in batch:
        if fut.done():
            continue
        if exc is None:
            fut.set_result(msg)
        else:
            fut.set_exception(exc)


def dlq_headers(
    headers: Sequence[tuple[str, bytes | None]] | None,
    reason: str,
    topic: str,
    partition: int | None,
    offset: int | None,
) -> Headers:
    """The original headers plus why and where the record failed."""
    out: Headers = [(k, v) for k, v in (headers or ()) if v is not None]
    out += [
        ("voice_dlq_reason", reason.encode()[:4000]),
        ("voice_dlq_topic", topic.encode()),
        ("voice_dlq_partition", str(partition).encode()),
        ("voice_dlq_offset", str(offset).encode()),
    ]
    return out
