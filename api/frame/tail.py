"""The edge's tail of the log: command acknowledgements and conversation records.

Every edge process reads all partitions of ``voice.acks`` (from the end: it only waits on its
own commands) and of ``voice.conversations`` (from the beginning: the views it serves are
derived from the log; or, with ``VOICE_EDGE_HISTORY_S``, from that far back by record time,
older conversations being read on demand by ``api.frame.cold``: decision 0011; so too
``voice.assistant``, a ``windowed`` topic). A thread
polls with confluent-kafka and hands decoded records to the event loop, one hand-over per
poll; nothing on a request path polls Kafka. The topics ``apart`` (those no turn writes to) are
read the same way by a second consumer in a thread of its own: a fetch costs the broker for
each partition it names.

A record the tail cannot use is skipped, logged (``topic[partition]@offset`` and why) and
counted in ``skipped`` (``/readyz`` shows the counts): one the codec refuses, or one a view's
handler raises on. The edge is a reader — every edge reads every record, from the beginning,
at every start — so it never dead-letters: the writer side does, once per record (the worker
agent that reads the topic, or the telemetry sink for a topic no worker reads; decision 0008).
A skipped record never stops the tail, never makes the edge unready, and leaves that
aggregate's view where it was (a caller waiting on it gets its bound's 503).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

from schemas.system import CommandAcknowledged
from streams.envelope import DecodeError, Envelope, decode
from streams.fetch import TAILING, take
from streams.free_text import describe, trace_of
from streams.settings import VoiceSettings
from streams.topics import ACKS, CONVERSATIONS, TopicSpec, topic_name

log = logging.getLogger(__name__)

RecordHandler = Callable[[Envelope], None]
LocatedHandler = Callable[[Envelope, int, int], None]
"""A handler that also gets the record's partition and offset."""
Read = tuple[str, int, int, bytes | None, bytes | None, list[tuple[str, bytes]] | None]
"""One record as polled: topic, partition, offset, key, value, headers."""
Step = tuple[tuple[str, int, int] | None, Callable[..., Any], tuple[Any, ...]]
"""One record's work on the loop: where it was read (None: bookkeeping that cannot fail),
the handler, its arguments."""


class AckTimeout(Exception):
    """The writer did not acknowledge a command in time (the command is still on the log)."""


class EdgeTail:
    """Consumes acks and conversation records for one edge process."""

    def __init__(self, settings: VoiceSettings, on_conversation: RecordHandler,
                 more: Mapping[TopicSpec, RecordHandler] | None = None,
                 located: Mapping[TopicSpec, LocatedHandler] | None = None,
                 live: Mapping[TopicSpec, RecordHandler] | None = None,
                 before_window: Mapping[TopicSpec, Callable[[bytes | None], bool]] | None = None,
                 windowed: Iterable[TopicSpec] = (),
                 apart: Iterable[TopicSpec] = ()) -> None:
        self.settings = settings
        self.on_conversation = on_conversation
        self.acks_topic = topic_name(settings, ACKS)
        self.conv_topic = topic_name(settings, CONVERSATIONS)
        self.more = {topic_name(settings, spec): h for spec, h in (more or {}).items()}
        """Further topics read from the beginning (staff views), each with its handler."""
        self.located = {topic_name(settings, spec): h for spec, h in (located or {}).items()}
        """Like ``more``, for handlers that need each record's partition and offset."""
        self.live = {topic_name(settings, spec): h for spec, h in (live or {}).items()}
        """Transient topics (reply deltas), read from their end: only what happens now."""
        self.before_window = ({} if settings.edge_history_s is None else
                              {topic_name(settings, spec): test
                               for spec, test in (before_window or {}).items()})
        """With ``VOICE_EDGE_HISTORY_S``: topics read from the beginning of which a record
        older than the window is not read (nor decoded) when its key passes the test — the
        turns' workflows, whose conversations are cold there too."""
        self.windowed = ({self.conv_topic} if settings.edge_history_s is None else
                         {self.conv_topic, *(topic_name(settings, spec) for spec in windowed)})
        """The topics read from the history window's start when there is one: the conversation
        log, and each other log of conversations that the edge reads on demand (the
        assistant's)."""
        self.apart = {topic_name(settings, spec) for spec in apart}
        """Topics read by a consumer of their own, beside the one that reads the rest. Each
        fetch names every partition its consumer reads, and costs the broker ~1.8 µs a
        partition named (docs/benchmarks.md, issue 14, thirty-seventh pass); a record on any of
        them ends a fetch. Topics that a turn does not write to (the staff's, the assistant's),
        read apart, are no longer named in the fetches that a turn's records end, ~7 a turn."""
        self.window_start_ms = 0
        """With ``VOICE_EDGE_HISTORY_S``: the record time the window starts at."""
        self.left_before_window = 0
        """Records ``before_window`` left unread at start (counted on the tail's thread)."""
        self._waiters: dict[str, asyncio.Future[Envelope]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._consumers = 1 + bool(self.apart)
        """How many consumers read: one, or two with topics ``apart``."""
        self._ready: Counter[str] = Counter()
        """Consumers assigned, caught up (under ``_lock``)."""
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.starts: dict[tuple[str, int], int] = {}
        """Per partition of a ``windowed`` topic, the offset this tail started at (set before
        ``assigned``; empty when it reads from the beginning): older records are cold."""
        self.partitions: dict[str, int] = {}
        """How many partitions each topic it reads has (set before ``assigned``)."""
        self.assigned = threading.Event()
        """Set once every consumer has its partitions."""
        self.caught_up = threading.Event()
        """Set once every log read from a start has been read up to its end at start."""
        self.skipped: Counter[tuple[str, str]] = Counter()
        """(topic, ``undecodable`` | ``not applied``) → records skipped since the start
        (changed and read on the event loop only)."""
        self.applied_at = 0.0
        """``time.monotonic()`` when the loop last finished applying records (with the last
        request's, ``api.frame.activity``, what tells the edge it is idle:
        ``streams.heap.collect_when_idle``)."""

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        groups: list[tuple[str, bool]] = [("voice-edge-tail", False)]
        if self.apart:
            groups.append(("voice-edge-tail-apart", True))
        self._threads = [threading.Thread(target=self._run, args=(apart,), name=name,
                                          daemon=True) for name, apart in groups]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def _one_more(self, what: str, event: threading.Event) -> None:
        """One more consumer is ``what`` (assigned, caught up): ``event`` once all are."""
        with self._lock:
            self._ready[what] += 1
            if self._ready[what] >= self._consumers:
                event.set()

    def expect_ack(self, command_id: str) -> asyncio.Future[Envelope]:
        """Register interest in a command's ack *before* producing the command."""
        fut: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        self._waiters[command_id] = fut
        return fut

    def forget_ack(self, command_id: str) -> None:
        """Drop interest in a command's ack (its command was never produced)."""
        fut = self._waiters.pop(command_id, None)
        if fut is not None and not fut.done():
            fut.cancel()

    async def wait_ack(self, command_id: str, fut: asyncio.Future[Envelope], timeout: float
                       ) -> CommandAcknowledged:
        try:
            env = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise AckTimeout(
                f"no acknowledgement of command {command_id!r} in {timeout}s") from None
        finally:
            self._waiters.pop(command_id, None)
        assert isinstance(env.record, CommandAcknowledged)
        return env.record

    def _assign(self, consumer: Consumer, apart: bool = False) -> dict[tuple[str, int], int]:
        """Assign every partition at once, each at a concrete offset (the log's start or end
        looked up here, not left to the client): every partition is then in the tail's first
        fetch. A logical offset is resolved by the client partition by partition after the
        assignment, and a partition resolved while a fetch was held joined only the next one,
        up to ``fetch.wait.max.ms`` later — at start, each step of the catch-up.

        ``apart``: the consumer of the topics ``apart`` (else: of every other topic). Returns
        where each log it reads from a start ended when it looked."""
        md = consumer.list_topics(timeout=10)
        parts: list[TopicPartition] = []
        starts = [(self.acks_topic, OFFSET_END), (self.conv_topic, OFFSET_BEGINNING),
                  *((t, OFFSET_BEGINNING) for t in (*self.more, *self.located)),
                  *((t, OFFSET_END) for t in self.live)]
        starts = [(topic, start) for topic, start in starts if (topic in self.apart) == apart]
        for topic, start in starts:
            t = md.topics.get(topic)
            if t is None or t.error is not None:
                raise RuntimeError(f"topic {topic!r} is missing: run `voice topics create`")
            parts += [TopicPartition(topic, p, start) for p in t.partitions]
        self.partitions.update({topic: len(md.topics[topic].partitions) for topic, _ in starts})
        # Where each log starts and ends now: the edge is caught up once it reaches the ends.
        marks = {(tp.topic, tp.partition): consumer.get_watermark_offsets(
            TopicPartition(tp.topic, tp.partition), 10) for tp in parts}
        for tp in parts:
            low, high = marks[(tp.topic, tp.partition)]
            tp.offset = high if tp.offset == OFFSET_END else low
        if self.settings.edge_history_s is not None:
            parts = self._windowed(consumer, parts, marks)
        consumer.assign(parts)
        ends = {(topic, p): marks[(topic, p)][1]
                for topic in (self.conv_topic, *self.more, *self.located)
                if (topic in self.apart) == apart for p in md.topics[topic].partitions}
        self._one_more("assigned", self.assigned)
        return ends

    def _windowed(self, consumer: Consumer, parts: list[TopicPartition],
                  marks: Mapping[tuple[str, int], tuple[int, int]]) -> list[TopicPartition]:
        """``parts`` with the ``windowed`` topics' partitions starting ``edge_history_s`` back
        (by record time); ``starts`` notes where, for the cold reads below it."""
        assert self.settings.edge_history_s is not None
        with self._lock:  # one window for every consumer: the first to look sets it
            if not self.window_start_ms:
                self.window_start_ms = int((time.time() - self.settings.edge_history_s) * 1000)
            since_ms = self.window_start_ms
        logs = [TopicPartition(tp.topic, tp.partition, since_ms) for tp in parts
                if tp.topic in self.windowed]
        found = consumer.offsets_for_times(logs, timeout=10)
        for tp in found:
            if tp.error is not None:
                raise RuntimeError(f"no offset by time for {tp.topic}[{tp.partition}]: "
                                   f"{tp.error}")
            if tp.offset < 0:  # no record that recent: start at the end
                tp.offset = marks[(tp.topic, tp.partition)][1]
            self.starts[(tp.topic, tp.partition)] = tp.offset
        return [*(tp for tp in parts if tp.topic not in self.windowed), *found]

    def _run(self, apart: bool = False) -> None:
        consumer = Consumer({
            "bootstrap.servers": self.settings.bootstrap,
            "group.id": f"{self.settings.group_prefix}-edge-unused",  # assign(): no group joins
            "enable.auto.commit": False,
            # The idle-fetch setting (500 ms, any record ends the wait). It was 5 ms here while
            # the tail left its start offsets to the client (see ``_assign``): 200 fetches a
            # second, each naming every partition it reads, cost the broker ~40 % of a core
            # with nothing to read (docs/benchmarks.md, fourth pass).
            **TAILING,
            # Offsets are concrete (``_assign``); one the log no longer holds (retention ran
            # between the look-up and the fetch) restarts at the log's start, never its end.
            "auto.offset.reset": "earliest",
        })
        try:
            ends: dict[tuple[str, int], int] = {}
            while not self._stop.is_set():
                try:
                    ends = self._assign(consumer, apart)
                    break
                except Exception as exc:
                    log.warning("edge tail cannot assign yet: %s", exc)
                    self._stop.wait(1.0)
            caught_up = False
            while not self._stop.is_set():
                msgs = take(consumer, 0.1)
                if self.before_window and not caught_up:
                    msgs = self._within_window(msgs)
                self._hand_over([(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                  m.headers()) for m in msgs if not m.error()])
                if not caught_up:
                    caught_up = self._check_caught_up(consumer, ends)
        finally:
            consumer.close()

    def _within_window(self, msgs: list[Any]) -> list[Any]:
        """Catching up: ``msgs`` without the records ``before_window`` leaves unread, told by
        topic, time and key alone — ~1 µs a record, against ~20 to decode it."""
        since, tests = self.window_start_ms, self.before_window
        kept = []
        for m in msgs:
            test = tests.get(m.topic())
            if test is not None and m.error() is None and m.timestamp()[1] < since \
                    and test(m.key()):
                self.left_before_window += 1
                continue
            kept.append(m)
        return kept

    def _check_caught_up(self, consumer: Consumer, ends: Mapping[tuple[str, int], int]) -> bool:
        """Whether ``consumer`` has read each of ``ends`` (its logs' ends at start, as
        ``_assign`` gave them) up to there; ``caught_up`` is set once every consumer has."""
        tps = [TopicPartition(t, p) for t, p in ends]
        positions = ({(tp.topic, tp.partition): tp.offset for tp in consumer.position(tps)}
                     if tps else {})
        # A partition the window starts at its end has nothing to read (and no position yet).
        if all(end == 0 or positions[tp] >= end
               or self.starts.get(tp, -1) >= end
               for tp, end in ends.items()):
            self._one_more("caught up", self.caught_up)
            return True
        return False

    def _hand_over(self, records: list[Read]) -> None:
        """Decode one poll's records here, then apply them all with one hand-over to the
        loop: each hand-over wakes the loop through its self-pipe, and a burst of a thousand
        records handed over one by one was a thousand wakes (docs/benchmarks.md)."""
        steps = [self._handle(*read) for read in records]
        if steps:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._apply_all, steps)

    def _handle(self, topic: str, partition: int, offset: int, key: bytes | None,
                value: bytes | None, headers: list[tuple[str, bytes]] | None) -> Step:
        """Decode one record (on the tail's thread); the step that applies it on the loop."""
        try:
            env = decode(key, value, headers)
        except DecodeError as exc:  # the writer side dead-letters it; the edge skips it
            log.info("edge skips %s[%s]@%s: %s", topic, partition, offset, exc.reason)
            # Counted on the loop, like every other change of ``skipped``.
            return None, self.skipped.update, ([(topic, "undecodable")],)
        where = (topic, partition, offset)
        if topic == self.acks_topic:
            return where, self._resolve, (env,)
        if topic in self.more:
            return where, self.more[topic], (env,)
        if topic in self.live:
            return where, self.live[topic], (env,)
        if topic in self.located:
            return where, self.located[topic], (env, partition, offset)
        return where, self.on_conversation, (env,)

    def _apply_all(self, steps: list[Step]) -> None:
        """Apply one poll's records on the loop, in the order they were read."""
        for where, handler, args in steps:
            if where is None:
                handler(*args)
            else:
                self._apply(where, handler, *args)
        self.applied_at = time.monotonic()

    def _apply(self, where: tuple[str, int, int], handler: Callable[..., None],
               *args: Any) -> None:
        """Run one view's handler on the loop; a record it raises on is logged and counted."""
        try:
            handler(*args)
        except Exception as exc:
            topic, partition, offset = where
            self.skipped[(topic, "not applied")] += 1
            # Described with where it was raised, not quoted: it may echo the record's values.
            log.error("edge view could not apply %s[%s]@%s; skipped: %s\n%s", topic,
                      partition, offset, describe(exc), trace_of(exc))

    def skipped_counts(self) -> dict[str, dict[str, int]]:
        """``skipped`` by topic, for ``/ops/edge``."""
        out: dict[str, dict[str, int]] = {}
        for (topic, why), n in sorted(self.skipped.items()):
            out.setdefault(topic, {})[why] = n
        return out

    def _resolve(self, env: Envelope) -> None:
        fut = self._waiters.get(env.key)
        if fut is not None and not fut.done():
            fut.set_result(env)
