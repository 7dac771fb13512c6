"""A worker's own reader of a whole topic: every partition, from the beginning, in a thread.

Faust hands each worker only the partitions it owns, but some things a worker needs are about
everything — the issue catalog the concern agent searches must hold every issue of the tenant
whose conversation it serves, whichever worker owns that issue's partition. A ``Follower``
reads all partitions with its own consumer (``assign``, no group, nothing committed), decodes
each record and hands it to ``apply`` on its thread; what ``apply`` builds is kept in memory
and rebuilt from the log at every start.

``fresh(timeout)`` is read-your-writes for a caller: it returns once the follower has applied
every record that was on the topic when it was called (or the timeout passed), so a search
right after an issue was opened finds it. The caller asks the broker where each partition ends
itself (one ``ListOffsets`` request for all of them) and returns at once when the follower has
applied that far — the usual case, a topic that did not move: a search costs one round trip,
not a wait for the follower's next poll (that wait, ~100–350 ms, was most of a turn's time in
``turn.overhead``). Only a follower still behind is waited for; it wakes its callers after each
batch it applies. A record that cannot be decoded, or that ``apply``
raises on, is logged (``topic[partition]@offset``) and skipped: the follower is a reader, the
topic's writer side dead-letters (decision 0008). It must never write anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from streams.envelope import DecodeError, Envelope, decode
from streams.fetch import TAILING, LogEnds, take
from streams.free_text import describe, trace_of
from streams.settings import VoiceSettings
from streams.topics import TopicSpec, topic_name

log = logging.getLogger(__name__)

Apply = Callable[[Envelope], None]

POLL_S = 0.1
PARTITIONS_FRESH_S = 30.0
"""How long ``Follower.ends`` trusts the partitions it looked up."""


class Follower:
    """Applies every record of one topic (all partitions) to an in-memory view, in a thread."""

    def __init__(self, settings: VoiceSettings, spec: TopicSpec, apply: Apply,
                 name: str, types: frozenset[str] | None = None) -> None:
        """``types``: only records of these ``ce_type`` s are decoded and applied (the others
        are passed over by their header, undecoded)."""
        self.settings = settings
        self.topic = topic_name(settings, spec)
        self.apply = apply
        self.name = name
        self.types = {t.encode() for t in types} if types is not None else None
        self.skipped = 0
        """Records skipped since the start (undecodable, or ``apply`` raised)."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._asked: list[threading.Event] = []
        """Callers of ``fresh`` whose targets are not known yet."""
        self._waiting: list[tuple[dict[int, int], threading.Event]] = []
        """(end offset per partition when asked, the caller's event)."""
        self._applied: dict[int, int] = {}
        """Per partition, the offset after the last record handled (applied or passed over)."""
        self._ends_now = LogEnds(settings.bootstrap)
        """Where the topic ends now (one request; a new admin client after a failure)."""
        self._partitions: list[int] | None = None
        self._partitions_at = 0.0

    def start(self) -> None:
        """Start the thread (once; later calls do nothing)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=f"voice-follow-{self.name}",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._ends_now.drop()

    def fresh(self, timeout: float) -> bool:
        """Wait until every record on the topic now has been applied; False on timeout."""
        self.start()
        asked = threading.Event()
        try:
            ends = self.ends(timeout)
        except Exception as exc:  # the follower's thread asks again, as it always did
            log.info("follower %s: where %s ends, asked by its thread: %s", self.name,
                     self.topic, describe(exc))
            ends = None
        with self._lock:
            if ends is None:
                self._asked.append(asked)
            elif self._reached(ends):
                return True
            else:
                self._waiting.append((ends, asked))
        return asked.wait(timeout)

    def ends(self, timeout: float) -> dict[int, int]:
        """Where each partition of the topic ends now (its high watermark), in one request."""
        return self._ends_now(self.topic, self._partitions_of_topic(timeout), timeout)

    def _partitions_of_topic(self, timeout: float) -> list[int]:
        """The topic's partitions, looked up at most every ``PARTITIONS_FRESH_S``: a metadata
        request per ``fresh`` was one more broker request per turn (a tool that reads the
        catalog asks on every call). A partition added since is seen within that time."""
        now = time.monotonic()
        if self._partitions is None or now - self._partitions_at > PARTITIONS_FRESH_S:
            md = self._ends_now.admin().list_topics(self.topic, timeout=timeout)
            t = md.topics.get(self.topic)
            if t is None or t.error is not None or not t.partitions:
                raise LookupError(f"topic {self.topic!r} is missing")
            self._partitions, self._partitions_at = sorted(t.partitions), now
        return self._partitions

    def _reached(self, ends: dict[int, int]) -> bool:
        """Whether every record up to ``ends`` has been handled (under the lock)."""
        return all(end <= 0 or self._applied.get(p, -1) >= end for p, end in ends.items())

    # --- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        consumer = Consumer({
            "bootstrap.servers": self.settings.bootstrap,
            "group.id": f"{self.settings.group_prefix}-follow-unused",  # assign(): no group
            "enable.auto.commit": False,
            **TAILING,  # an idle follower asks twice a second, a record wakes it at once
        })
        try:
            parts = self._assign(consumer)
            while not self._stop.is_set() and parts:
                msgs = take(consumer, POLL_S)
                handled: dict[int, int] = {}
                for msg in msgs:
                    if not msg.error():
                        self._handle(msg)
                        handled[msg.partition()] = msg.offset() + 1
                if handled:
                    with self._lock:
                        self._applied.update(handled)
                try:
                    self._answer(consumer, parts)
                except Exception as exc:  # a broker that does not answer now: ask again
                    log.warning("follower %s cannot read where %s ends yet: %s", self.name,
                                self.topic, exc)
                    self._stop.wait(1.0)
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer) -> list[int]:
        while not self._stop.is_set():
            try:
                md = consumer.list_topics(self.topic, timeout=10)
                t = md.topics.get(self.topic)
                if t is None or t.error is not None or not t.partitions:
                    raise LookupError(f"topic {self.topic!r} is missing")
                parts = sorted(t.partitions)
                consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
                return parts
            except Exception as exc:
                log.warning("follower %s cannot assign %s yet: %s", self.name, self.topic, exc)
                self._stop.wait(1.0)
        return []

    def _handle(self, msg: Any) -> None:
        if self.types is not None:
            ce_type = next((v for k, v in msg.headers() or [] if k == "ce_type"), None)
            if ce_type not in self.types:
                return
        where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
        try:
            env = decode(msg.key(), msg.value(), msg.headers())
        except DecodeError as exc:
            self.skipped += 1
            log.info("follower %s skips %s: %s", self.name, where, exc.reason)
            return
        try:
            self.apply(env)
        except Exception as exc:
            self.skipped += 1
            # Described with where it was raised, not quoted: it may echo the record's values.
            log.error("follower %s could not apply %s; skipped: %s\n%s", self.name, where,
                      describe(exc), trace_of(exc))

    def _answer(self, consumer: Consumer, parts: list[int]) -> None:
        """Give new ``fresh`` callers their targets; wake those whose targets are reached."""
        with self._lock:
            asked, self._asked = self._asked, []
        if asked:
            try:
                ends = {p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), 10)[1]
                        for p in parts}
            except Exception:
                with self._lock:
                    self._asked = asked + self._asked
                raise
            with self._lock:
                self._waiting += [(ends, ev) for ev in asked]
        with self._lock:
            if not self._waiting:
                return
        # The consumer's position also steps over what is not a record (a transaction's
        # marker), which the offsets handled alone would wait for in vain.
        at = {tp.partition: tp.offset for tp in
              consumer.position([TopicPartition(self.topic, p) for p in parts])}
        with self._lock:
            for p, offset in at.items():
                if offset > self._applied.get(p, -1):
                    self._applied[p] = offset
            still = []
            for ends, ev in self._waiting:
                if self._reached(ends):
                    ev.set()
                else:
                    still.append((ends, ev))
            self._waiting = still
