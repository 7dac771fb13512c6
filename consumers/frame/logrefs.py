"""An aggregate's records read back by position: how a step gets content without carrying it.

A turn's input names the records it needs — the log partition and, per record, its seq and
offset — instead of copying them: a copy made every turn's workflow record, its changelog, its
ClickHouse row and every edge grow with the conversation (quadratic storage), and one long
conversation pushed them past the broker's record limit. The step fetches exactly those
records (``LogReader.read``), as a turn fetches a dataset by its ``DatasetRef``; a worker on
any machine can, since they are on the log, not in another partition's table.

What a worker keeps per conversation is an index of positions (a few numbers per record),
bounded by ``recent``: the most recent records whose content fits a byte budget, and at most
``MAX_ENTRIES`` of them. Never content.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import methodcaller
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, TopicPartition

from streams.envelope import DecodeError, Envelope, decode
from streams.fetch import TAILING, take
from streams.settings import VoiceSettings
from streams.topics import TopicSpec, topic_name

MAX_ENTRIES = 1000
"""Records one index (and so one turn's input) names at most, whatever their size."""

SEEK_GAP = 100
"""Read on through other keys' records up to this many offsets; farther, seek."""

READ_WAIT_S = 0.2
"""How long a read waits for the next record to arrive (``take``) before it looks again."""

RECENT_BYTES = 32 * 1024 * 1024
"""What ``RecentRecords`` holds at most, in bytes of memory as ``decoded_weight`` estimates
them (until issue 14's twenty-fifth pass: 8 MiB of bytes on the log, the same records where
a record holds no positions)."""

DECODED_PER_LOG_BYTE = 4
POSITION_BYTES = 80
"""A decoded record takes about four times its key and value on the log, plus ~80 bytes for
each (seq, offset) pair it names (a tuple of two ints, against ~12 bytes of JSON): measured,
2,850 bytes for a 700-byte ``TurnOpened`` without positions, 128,629 for a 13,699-byte one
with 1,000 (docs/benchmarks.md, issue 14, twenty-fifth pass)."""


def decoded_weight(env: Envelope, size: int) -> int:
    """The memory ``env``, ``size`` bytes on the log, takes decoded (an estimate)."""
    history = getattr(env.record, "history", None)
    positions = len(getattr(history, "entries", None) or ())
    return size * DECODED_PER_LOG_BYTE + positions * POSITION_BYTES


@dataclass(frozen=True)
class Position:
    """Where one record of an aggregate's log is: its seq (checked on reading) and offset."""

    seq: int
    offset: int

    def to_json(self) -> list[int]:
        return [self.seq, self.offset]

    @classmethod
    def from_json(cls, value: Sequence[int]) -> Position:
        return cls(int(value[0]), int(value[1]))


class LogUnavailable(Exception):
    """The records cannot be read: not on the log as indexed (``retryable=False``), or the
    broker did not answer in time (``retryable=True``). Its message names positions."""

    plain_message = True

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class LogReader(Protocol):
    """Reads records of one key back from a topic partition by position."""

    async def read(self, spec: TopicSpec, partition: int, key: str,
                   positions: Sequence[Position]) -> list[Envelope]:
        """The records at ``positions``, in that order; ``LogUnavailable`` if one is not
        there or is not the indexed seq of ``key``."""

    async def scan(self, spec: TopicSpec, partition: int, key: str, start: int,
                   through: int) -> list[Envelope]:
        """``key``'s records from offset ``start`` on, each seq once, in seq order, up to
        and including seq ``through``; ``LogUnavailable`` if the log ends before it."""


def scan_span(found: dict[int, Envelope], env: Envelope, key: str, through: int) -> bool:
    """Keep ``env`` in ``found`` (by seq) if it is ``key``'s and within ``through``; whether
    the scan is done (seq ``through`` seen). A record written twice (a writer that crashed
    before its table write) is kept once."""
    if env.key != key or env.seq is None:
        return False
    if env.seq <= through:
        found.setdefault(env.seq, env)
    return env.seq >= through


_SIZE = methodcaller("get", "bytes", 0)


def recent(entries: list[dict[str, Any]], budget: int, keep: int = 1,
           max_entries: int = MAX_ENTRIES) -> list[dict[str, Any]]:
    """The most recent ``entries`` (each with ``bytes``, never negative) whose sizes add up to
    at most ``budget`` — but at least the last ``keep`` — and at most ``max_entries`` of them.

    The running totals (newest first) rise, so where the budget is passed is a bisection; the
    loop this replaces was a writer's largest cost in a conversation of a thousand entries."""
    tail = entries[-max_entries:] if max_entries > 0 else []
    totals = list(accumulate(map(_SIZE, reversed(tail))))
    taken = min(len(tail), max(bisect_right(totals, budget), keep))
    return tail[len(tail) - taken:]


def _consumer(settings: VoiceSettings) -> Consumer:
    """A consumer for reads by position: never in a group (``assign`` only), never commits."""
    return Consumer({"bootstrap.servers": settings.bootstrap,
                     "group.id": f"voice-logread-{uuid.uuid4().hex}",
                     "enable.auto.commit": False, "enable.auto.offset.store": False,
                     "auto.offset.reset": "error", **TAILING,
                     "fetch.message.max.bytes": 2 * 1024 * 1024})


def fetch_records(c: Consumer, topic: str, partition: int, key: str,
                  positions: Sequence[Position], timeout: float = 10.0) -> list[Envelope]:
    """``LogReader.read`` on the broker (blocking) with consumer ``c``: assigned at the first
    offset, reading on while the next one is near and seeking when it is far; unassigned after,
    so ``c`` can serve the next read."""
    if not positions:
        return []
    expected = {p.offset: p.seq for p in positions}
    wanted = sorted(expected)
    found: dict[int, Envelope] = {}
    where = f"{topic}[{partition}]"
    deadline = time.monotonic() + timeout
    try:
        i = 0
        while i < len(wanted):
            c.assign([TopicPartition(topic, partition, wanted[i])])
            seek = False
            while i < len(wanted) and not seek:
                if time.monotonic() > deadline:
                    raise LogUnavailable(f"could not read {where}@{wanted[i]} in {timeout:.0f} s",
                                         retryable=True)
                for msg in take(c, READ_WAIT_S):
                    err = msg.error()
                    if err is not None:
                        if err.fatal() or err.code() == KafkaError._AUTO_OFFSET_RESET:
                            raise LogUnavailable(f"cannot read {where}@{wanted[i]}: {err.str()}",
                                                 retryable=False)
                        continue
                    offset = msg.offset()
                    if offset < wanted[i]:
                        continue
                    if offset > wanted[i]:
                        raise LogUnavailable(f"{where} has no record at offset {wanted[i]}",
                                             retryable=False)
                    found[offset] = _checked(msg, where, key, expected[offset])
                    i += 1
                    if i == len(wanted) or wanted[i] - offset > SEEK_GAP:
                        seek = True
                        break
    finally:
        c.unassign()
    return [found[p.offset] for p in positions]


def scan_records(c: Consumer, topic: str, partition: int, key: str, start: int,
                 through: int, timeout: float = 30.0) -> list[Envelope]:
    """``LogReader.scan`` on the broker (blocking) with consumer ``c``: assigned at
    ``start`` (or the log's first offset, if later), reading on until ``key``'s seq
    ``through``; unassigned after. What it keeps is the caller's to bound (it asked for that
    span); no record of another key is kept."""
    where = f"{topic}[{partition}]"
    found: dict[int, Envelope] = {}
    if through < 1:
        return []
    deadline = time.monotonic() + timeout
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
        start = max(start, low)
        c.assign([TopicPartition(topic, partition, start)])
        offset = start - 1
        while True:
            if offset >= high - 1:
                raise LogUnavailable(f"{where} ends at {high} before seq {through} of {key!r} "
                                     f"(read from {start})", retryable=False)
            if time.monotonic() > deadline:
                raise LogUnavailable(f"could not read {where} from {start} to seq {through} of "
                                     f"{key!r} in {timeout:.0f} s", retryable=True)
            for msg in take(c, READ_WAIT_S):
                err = msg.error()
                if err is not None:
                    if err.fatal() or err.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise LogUnavailable(f"cannot read {where}@{start}: {err.str()}",
                                             retryable=False)
                    continue
                offset = msg.offset()
                try:
                    env = decode(msg.key(), msg.value(), msg.headers())
                except DecodeError:
                    continue  # not a record (dead-lettered by its consumer); not ``key``'s
                if scan_span(found, env, key, through):
                    return [found[s] for s in sorted(found)]
    finally:
        c.unassign()


def _checked(msg: Any, where: str, key: str, seq: int) -> Envelope:
    try:
        env = decode(msg.key(), msg.value(), msg.headers())
    except DecodeError as exc:
        raise LogUnavailable(f"{where}@{msg.offset()} is not a record: {exc.reason}",
                             retryable=False) from None
    return checked(env, where, msg.offset(), key, seq)


def checked(env: Envelope | None, where: str, offset: int, key: str, seq: int) -> Envelope:
    """The record found at ``where@offset`` if it is seq ``seq`` of ``key`` — the one position
    check of every ``LogReader``; else ``LogUnavailable`` (not retryable: the log will not
    change), naming what is there. ``None``: nothing is there."""
    if env is None:
        raise LogUnavailable(f"{where} has no record at offset {offset}", retryable=False)
    if env.key != key or env.seq != seq:
        raise LogUnavailable(f"{where}@{offset} holds seq {env.seq} of {env.key!r}, not "
                             f"seq {seq} of {key!r}", retryable=False)
    return env


def scan_held(envs: Iterable[Envelope], where: str, key: str, through: int) -> list[Envelope]:
    """``LogReader.scan`` over records already in memory (from the scan's start, in offset
    order): ``key``'s seqs up to ``through``, or ``LogUnavailable`` if they end before it."""
    found: dict[int, Envelope] = {}
    if through < 1:
        return []
    for env in envs:
        if scan_span(found, env, key, through):
            return [found[s] for s in sorted(found)]
    raise LogUnavailable(f"{where} ends before seq {through} of {key!r}", retryable=False)


class RecentRecords:
    """Records of aggregate logs this worker's writers put there lately, by where they are: a
    read by position whose records are all here needs no fetch.

    A turn's step reads back records its own worker has just written: the message that opened
    the turn, and the transcript before it. When the turn's workflow and its conversation have
    the same owner, the read was a consumer's assignment, a fetch and a thread hop for records
    already decoded in memory (~2 ms of a turn, docs/benchmarks.md, "Issue 14, fifth pass";
    held as consumed then, as placed since decision 0016). What is held is what the log holds
    at that offset (the log is never rewritten; sealed content stays sealed), and every
    position is checked as a fetched one is (``checked``). The least recently used go first
    past ``budget`` bytes of memory (``decoded_weight``: a long conversation's ``TurnOpened``,
    ~15 KB on the log, is ~130 KB decoded, so a budget of bytes on the log held up to ~9
    times it).
    Thread-safe: writers remember on the worker's loop, steps read on theirs.
    """

    def __init__(self, budget: int = RECENT_BYTES) -> None:
        self.budget = budget
        self._held: OrderedDict[tuple[str, int, int], tuple[Envelope, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def remember(self, topic: str, partition: int, offset: int, env: Envelope,
                 size: int) -> None:
        """Hold ``env``, read at ``topic[partition]@offset`` (``size`` bytes on the log)."""
        size = decoded_weight(env, size)
        if size > self.budget:
            return
        where = (topic, partition, offset)
        with self._lock:
            old = self._held.pop(where, None)
            if old is not None:
                self._bytes -= old[1]
            self._held[where] = (env, size)
            self._bytes += size
            while self._bytes > self.budget:
                self._bytes -= self._held.popitem(last=False)[1][1]

    def held(self, topic: str, partition: int, key: str,
             positions: Sequence[Position]) -> list[Envelope] | None:
        """The records at ``positions`` if every one is held (each checked to be the seq of
        ``key`` indexed there: ``LogUnavailable`` if not), else ``None``."""
        with self._lock:
            found = [self._held.get((topic, partition, p.offset)) for p in positions]
            if any(f is None for f in found):
                return None
            for p in positions:
                self._held.move_to_end((topic, partition, p.offset))
        where = f"{topic}[{partition}]"
        return [checked(f[0], where, p.offset, key, p.seq)  # type: ignore[index]
                for f, p in zip(found, positions, strict=True)]

    def __len__(self) -> int:
        return len(self._held)


class KafkaLogReader:
    """``LogReader`` on the broker; the blocking read runs in a thread.

    Consumers are kept and reused (at most ``pool_size`` idle): a new one per read spent
    ≈ 200 ms connecting and fetching metadata before its first record — most of a turn's
    overhead (docs/benchmarks.md). Concurrent reads each take their own consumer, since one
    consumer's assignment serves one read at a time. One that failed is closed, not kept.

    ``pool_size`` covers the reads that run at once: they run on the default executors of the
    worker's two loops (the writer's and the steps', six threads each on two cores). With 4
    kept, a burst of turns opened and closed a consumer every few turns — a connection, its
    metadata and a group coordinator look-up each (docs/benchmarks.md, fourth pass). An idle
    kept consumer has no assignment and fetches nothing.
    """

    def __init__(self, settings: VoiceSettings, timeout: float = 10.0,
                 pool_size: int = 12) -> None:
        self.settings = settings
        self.timeout = timeout
        self.pool_size = pool_size
        self.recent = RecentRecords()
        """Records this worker's writers placed lately, read without a fetch
        (``RecentRecords``)."""
        self._idle: list[Consumer] = []
        self._lock = threading.Lock()

    def produced(self, spec: TopicSpec, partition: int, offset: int, env: Envelope,
                 size: int) -> None:
        """Hold ``env``, which this worker's writer put at ``spec[partition]@offset``
        (``size`` bytes on the log): a step of this worker finds it before any consumer of
        the log has read it back (a turn starts once its record is on the log)."""
        self.recent.remember(topic_name(self.settings, spec), partition, offset, env, size)

    def _take(self) -> Consumer:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _consumer(self.settings)

    def _give(self, c: Consumer) -> None:
        with self._lock:
            if len(self._idle) < self.pool_size:
                self._idle.append(c)
                return
        c.close()

    def _using(self, fn: Callable[..., list[Envelope]], *args: Any) -> list[Envelope]:
        """``fn(consumer, *args)`` with a kept consumer (a new one if none is idle)."""
        c = self._take()
        try:
            out = fn(c, *args)
        except BaseException:
            c.close()
            raise
        self._give(c)
        return out

    async def read(self, spec: TopicSpec, partition: int, key: str,
                   positions: Sequence[Position]) -> list[Envelope]:
        if not positions:  # a conversation's first turn: nothing before it to read
            return []
        topic = topic_name(self.settings, spec)
        held = self.recent.held(topic, partition, key, positions)
        if held is not None:
            return held
        return await asyncio.to_thread(self._using, fetch_records, topic, partition, key,
                                       list(positions), self.timeout)

    def close(self) -> None:
        """Close the idle consumers (the worker is stopping)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    async def scan(self, spec: TopicSpec, partition: int, key: str, start: int,
                   through: int) -> list[Envelope]:
        return await asyncio.to_thread(self._using, scan_records,
                                       topic_name(self.settings, spec), partition, key, start,
                                       through, 3 * self.timeout)


class MemoryLogReader:
    """``LogReader`` over records held in memory (tests): ``append`` gives each its offset."""

    def __init__(self) -> None:
        self.logs: dict[tuple[str, int], list[Envelope]] = {}
        self.reads: list[tuple[str, int, str, tuple[Position, ...]]] = []

    def append(self, spec: TopicSpec, partition: int, env: Envelope) -> int:
        """Put ``env`` at the end of ``spec``'s partition; returns its offset."""
        log = self.logs.setdefault((spec.name, partition), [])
        log.append(env)
        return len(log) - 1

    async def read(self, spec: TopicSpec, partition: int, key: str,
                   positions: Sequence[Position]) -> list[Envelope]:
        self.reads.append((spec.name, partition, key, tuple(positions)))
        log = self.logs.get((spec.name, partition), [])
        return [checked(log[p.offset] if 0 <= p.offset < len(log) else None,
                        f"{spec.name}[{partition}]", p.offset, key, p.seq) for p in positions]

    async def scan(self, spec: TopicSpec, partition: int, key: str, start: int,
                   through: int) -> list[Envelope]:
        return scan_held(self.logs.get((spec.name, partition), [])[start:],
                         f"{spec.name}[{partition}]", key, through)
