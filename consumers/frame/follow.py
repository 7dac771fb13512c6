"""A worker's own reader of a whole topic: every partition, from the beginning, in a thread.

Faust hands each worker only the partitions it owns, but some things a worker needs are about
everything — the issue catalog the concern agent searches must hold every issue of the tenant
whose conversation it serves, whichever worker owns that issue's partition. A ``Follower``
reads all partitions with its own consumer (``assign``, no group, nothing committed), decodes
each record and hands it to ``apply`` on its thread; what ``apply`` builds is kept in memory
and rebuilt from the log at every start.

``fresh(timeout)`` is read-your-writes for a caller: it returns once the follower has applied
every record that was on the topic when it was called (or the timeout passed), so a search
right after an issue was opened finds it. A record that cannot be decoded, or that ``apply``
raises on, is logged (``topic[partition]@offset``) and skipped: the follower is a reader, the
topic's writer side dead-letters (decision 0008). It must never write anything.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from streams.envelope import DecodeError, Envelope, decode
from streams.free_text import describe, trace_of
from streams.settings import VoiceSettings
from streams.topics import TopicSpec, topic_name

log = logging.getLogger(__name__)

Apply = Callable[[Envelope], None]


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

    def fresh(self, timeout: float) -> bool:
        """Wait until every record on the topic now has been applied; False on timeout."""
        self.start()
        asked = threading.Event()
        with self._lock:
            self._asked.append(asked)
        return asked.wait(timeout)

    # --- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        consumer = Consumer({
            "bootstrap.servers": self.settings.bootstrap,
            "group.id": f"{self.settings.group_prefix}-follow-unused",  # assign(): no group
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        })
        try:
            parts = self._assign(consumer)
            while not self._stop.is_set() and parts:
                first = consumer.poll(0.1)
                msgs = [first, *consumer.consume(num_messages=500, timeout=0)] if first else []
                for msg in msgs:
                    if not msg.error():
                        self._handle(msg)
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
            self._waiting += [(ends, ev) for ev in asked]
        if not self._waiting:
            return
        at = {tp.partition: tp.offset for tp in
              consumer.position([TopicPartition(self.topic, p) for p in parts])}
        still = []
        for ends, ev in self._waiting:
            if all(end <= 0 or at.get(p, -1) >= end for p, end in ends.items()):
                ev.set()
            else:
                still.append((ends, ev))
        self._waiting = still
