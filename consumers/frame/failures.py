"""What a worker's agent does with a record it cannot process (decision 0008).

Every agent that ``WorkerContext.wire`` / ``wire_raw`` makes consumes through ``consume``,
which runs each record through a ``RecordGuard``, in this order:

1. **handle** the record, retried per ``streams.retry.RetryPolicy`` (a failure that says it is
   not retryable — ``Unprocessable``, a broker refusal that is not retriable — gets one try);
2. still failing: **dead-letter** it as it came (key, value, headers) to ``<topic>.dlq`` with the
   reason (``streams.dead_letters``, the one way any consumer does), the dead letter itself
   retried the same way, and awaited;
3. **acknowledge** it, so Faust may commit past it (Faust commits up to the first offset not
   acknowledged); an agent whose handler holds records (``manual_ack``: the workflow runtime's
   lease) acknowledges a handled record itself, and only a dead-lettered one is acknowledged
   here;
4. the dead letter failing too: ``Halt``. The record is **not** acknowledged and the agent
   stops the worker (``faust.App.crash``): nothing is committed past it, and the partition's
   next owner — this worker restarted by ``voice up``, or another one — reads it again from the
   last commit. A record is never both unhandled and committed.

It never swallows a failure without either a dead letter or a stop.

An agent given ``lane`` (the writer's: the aggregate id, the record's key) handles records of
different lanes at once and each lane's in the order read, at most ``LANES_WINDOW`` records at a
time, each acknowledged when it is done (Faust still commits only a run of acknowledged
offsets, so nothing is committed past a record not yet handled). The writer waits on the
broker for every command's records (decision 0007); one command at a time across all of its
partitions made every command wait for all those before it — at 40 commands/s the writer was
busy waiting, and ``edge.post_message`` queued for seconds on a loaded machine.

A record that carries a W3C ``traceparent`` is handled inside a ``process {topic}`` span that
continues its trace (``streams.tracing``), so what the handler produces and the model and tool
calls it makes belong to the request that started it. A record without one (a timer's, a
janitor's) starts no trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Hashable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry.trace import SpanKind

from consumers.frame.writer import Raw
from streams.dead_letters import send_dead_letter
from streams.free_text import describe, trace_of
from streams.producer import RecordProducer
from streams.retry import RetryPolicy, Sleep, attempt
from streams.tracing import carried, span

log = logging.getLogger(__name__)

RawDispatch = Callable[[Raw, Any], Awaitable[None]]
Lane = Callable[[Raw], Hashable]
Skip = Callable[[Raw], bool]

LANES_WINDOW = 128
"""At most this many records of one laned agent are in flight (read ahead, being handled)."""


class InFlight:
    """The records an agent of this worker is handling right now (not those waiting in a
    buffer): a handover waits until there are none, so that every table write of a handled
    record is in the changelog before the partition's next owner recovers it."""

    def __init__(self) -> None:
        self._records: dict[int, tuple[Raw, float]] = {}
        """id → (the record, when it came: ``ages``)"""

    @contextlib.contextmanager
    def handling(self, raw: Raw) -> Iterator[None]:
        """Count ``raw`` as in flight for the ``with`` block."""
        self.add(raw)
        try:
            yield
        finally:
            self.discard(raw)

    def add(self, raw: Raw) -> None:
        """Count ``raw`` as in flight (until ``discard``)."""
        self._records[id(raw)] = (raw, time.monotonic())

    def discard(self, raw: Raw) -> None:
        self._records.pop(id(raw), None)

    def records(self) -> list[Raw]:
        """The records in flight now."""
        return [raw for raw, _since in list(self._records.values())]

    def ages(self) -> list[tuple[Raw, float]]:
        """The records in flight now, each with how long it has been (seconds)."""
        now = time.monotonic()
        return [(raw, now - since) for raw, since in list(self._records.values())]


class Halt(Exception):
    """A record was neither processed nor dead-lettered: its consumer must stop without
    committing it."""


class RecordGuard:
    """Retries one consumer's records, dead-letters those that keep failing, counts both."""

    def __init__(self, consumer: str, producer: Callable[[], RecordProducer],
                 policy: RetryPolicy, sleep: Sleep = asyncio.sleep) -> None:
        """``consumer`` names the agent in each dead letter's reason; ``producer`` is a
        callable so the worker's producer can be made lazily in its own loop."""
        self.consumer = consumer
        self.policy = policy
        self._producer = producer
        self._sleep = sleep
        self.dead_lettered = 0
        """Records this consumer sent to a dead-letter topic (diagnostics and tests)."""

    async def run(self, raw: Raw, handle: Callable[[], Awaitable[object]]) -> bool:
        """Handle ``raw``: True when handled, False when dead-lettered, ``Halt`` when neither."""
        failure, tries = await attempt(handle, self.policy, self._sleep)
        if failure is None:
            return True
        # Described, not quoted: a failure's message may echo the record's values.
        reason = (f"{self.consumer} failed after {tries} attempt{'s' if tries > 1 else ''}: "
                  f"{describe(failure)}")
        log.error("dead-lettering %s[%s]@%s: %s\n%s", raw.topic, raw.partition, raw.offset,
                  reason, trace_of(failure))
        send = functools.partial(send_dead_letter, self._producer(), raw.topic, raw.partition,
                                 raw.offset, raw.key, raw.value, raw.headers, reason)
        lost, _ = await attempt(send, self.policy, self._sleep)
        if lost is not None:
            raise Halt(f"{raw.topic}[{raw.partition}]@{raw.offset} could be neither processed "
                       f"({reason}) nor dead-lettered ({describe(lost)})"
                       ) from lost
        self.dead_lettered += 1
        return False


def _raw(topic: str, event: Any) -> Raw:
    msg = event.message
    headers = list(msg.headers.items()) if isinstance(msg.headers, dict) else msg.headers
    return Raw(topic, msg.partition, msg.offset, msg.key, msg.value, headers)


async def consume(events: AsyncIterable[Any], topic: str, guard: RecordGuard,
                  dispatch: RawDispatch, manual_ack: bool,
                  halt: Callable[[Halt], Awaitable[object]],
                  in_flight: InFlight | None = None, lane: Lane | None = None,
                  window: int = LANES_WINDOW, skip: Skip | None = None) -> None:
    """The body of one agent: every Faust event of ``topic`` through ``guard`` (module
    docstring), each counted in ``in_flight`` while it is handled; ``events`` must not
    acknowledge by itself (``stream.noack().events()``). With ``lane``, records of different
    lanes are handled at once, each lane's in order, at most ``window`` in flight. A record
    ``skip`` picks is acknowledged at once, unread: ``skip`` may pick only records that the
    handler would acknowledge and do nothing else with (none it would dead-letter)."""
    in_flight = in_flight or InFlight()
    if lane is not None:
        if skip is not None:
            raise ValueError("an agent with lanes skips nothing")
        await _consume_in_lanes(events, topic, guard, dispatch, manual_ack, halt, in_flight,
                                lane, window)
        return
    async for event in events:
        raw = _raw(topic, event)
        if skip is not None and skip(raw):
            event.ack()
            continue
        with in_flight.handling(raw):
            try:
                with _span(raw):
                    handled = await guard.run(raw, functools.partial(dispatch, raw, event))
            except Halt as exc:
                log.critical("stopping: %s", exc)
                await halt(exc)
                return
            if not (manual_ack and handled):
                event.ack()


async def _consume_in_lanes(events: AsyncIterable[Any], topic: str, guard: RecordGuard,
                            dispatch: RawDispatch, manual_ack: bool,
                            halt: Callable[[Halt], Awaitable[object]], in_flight: InFlight,
                            lane: Lane, window: int) -> None:
    """``consume`` with lanes: one task per record, chained behind its lane's last one."""
    last: dict[Hashable, asyncio.Task[None]] = {}
    running: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(window)
    stopped = asyncio.Event()

    async def stop(exc: Halt) -> None:
        if not stopped.is_set():
            stopped.set()
            log.critical("stopping: %s", exc)
            await halt(exc)

    async def one(raw: Raw, event: Any, before: asyncio.Task[None] | None) -> None:
        try:
            if before is not None:
                await asyncio.wait([before])  # its lane's previous record, however it ended
            if stopped.is_set():
                return  # neither handled nor acknowledged: the worker is stopping
            with _span(raw):
                handled = await guard.run(raw, functools.partial(dispatch, raw, event))
            if not (manual_ack and handled):
                event.ack()
        except Halt as exc:
            await stop(exc)
        except Exception as exc:  # not a record's failure (the guard has those): stop too
            await stop(Halt(f"{raw.topic}[{raw.partition}]@{raw.offset}: the agent failed "
                            f"({describe(exc)})"))
        finally:
            in_flight.discard(raw)
            slots.release()

    def forget(key: Hashable, task: asyncio.Task[None]) -> None:
        if last.get(key) is task:
            del last[key]

    async for event in events:
        await slots.acquire()
        if stopped.is_set():
            slots.release()
            return
        raw = _raw(topic, event)
        key = lane(raw)
        in_flight.add(raw)  # from now: a handover waits for it (its table write)
        task = asyncio.ensure_future(one(raw, event, last.get(key)))
        last[key] = task
        running.add(task)
        task.add_done_callback(running.discard)
        task.add_done_callback(functools.partial(forget, key))
    if running:  # the events ended (a test's, a stopping stream's): finish what was read
        await asyncio.wait(running)


def by_key(raw: Raw) -> Hashable:
    """The lane of a keyed record: its key (an aggregate's commands, in order)."""
    return raw.key


def _span(raw: Raw) -> AbstractContextManager[object]:
    """The ``process`` span of a traced record (messaging semantic conventions)."""
    context = carried(raw.headers)  # read once: a worker does it with every record
    if context is None:
        return nullcontext()
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka", "messaging.operation.type": "process",
        "messaging.destination.name": raw.topic}
    if raw.partition is not None:
        attributes["messaging.destination.partition.id"] = str(raw.partition)
    if raw.offset is not None:
        attributes["messaging.kafka.offset"] = raw.offset
    return span(f"process {raw.topic}", SpanKind.CONSUMER, attributes, context)
