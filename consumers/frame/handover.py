"""Handing partitions over between workers (a rebalance, a worker stopping) without losing what
was being handled, and without a partition left unread afterwards.

``VoiceApp`` is Faust's app with two changes, both for fault 4 of issue 12 (a rebalance storm):

1. **Before a handover** it runs ``before_handover`` (the workflow runtime lets go of its held
   leases) and waits — at most ``HANDOVER_WAIT_S`` — for the records its agents are handling
   (``consumers.frame.failures.InFlight``). Faust then flushes the producer (the tables'
   changelogs, every write held back by ``write_behind`` handed to it first), commits, and
   only then rejoins or leaves the group. Without the wait a handler
   still running after the handover wrote its table after the flush; the partition's next
   owner, recovering the changelog, never saw it, and a turn whose ``WorkflowStarted`` offset
   was committed stayed ``Thinking`` in no owner's table. Faust's own wait
   (``stream_wait_empty=True``) waits for every record not acknowledged — a running step's held
   lease, and a record its conductor could not hand to a suspended agent, which never is — and
   it swallows cancellation, so it has no bound.
2. **After a rebalance** ``unfetched`` finds partitions assigned to this worker that Faust's
   fetcher has left out of its set (seen after a storm: one partition never read again while
   the worker ran on) and ``resume_unfetched`` puts them back, with a warning.
3. **A commit stuck for good** behind records read but never handled (``holes``; the cause
   found is item 4, this catches any other) is repaired by ``reread_holes``: the partition is
   sought back to its committed offset, with a warning naming the offsets.
4. **Its consumer** does not let a record fetched before a rebalance move the read offset
   after it (``consumers.frame.stale_records``: that dropped the records the new generation
   read again, and stopped the partition's commit for good), and does not skip offsets of a
   topic that has no gaps of its own (``gapless_topics``: Faust counted them as acknowledged),
   and hands a record over only once its generation's seek is done. ``CommitFloor``
   (``consumers.frame.commit_floor``) reads a partition never committed from its start, and
   commits nothing past a record at the committed offset that no handler acknowledged.
   Every seek runs on the consumer's own thread (``consumers.frame.thread_seek``: from the
   event loop it raced aiokafka's fetch and killed Faust's fetcher).
5. **Its consumer** fetches no changelog partition Faust holds paused — those of the tables
   this worker owns, once recovered (``consumers.frame.changelog_fetch``): Faust's pause is its
   own bookkeeping, and every fetch of a turn named them all.

It must never acknowledge a record itself: it only waits, and tells Faust (and aiokafka under
it) what to fetch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import faust

from consumers.frame.changelog_fetch import fetch_only_read_changelogs
from consumers.frame.commit_floor import CommitFloor
from consumers.frame.failures import InFlight
from consumers.frame.fetch_wait import hold_fetches_at_most
from consumers.frame.stale_records import guard_stale_records
from consumers.frame.thread_seek import seek_on_consumer_thread
from consumers.frame.write_behind import WriteBehind, send_before_commit

log = logging.getLogger(__name__)

HANDOVER_WAIT_S = 10.0
"""At most this long a handover waits for the records in flight (then goes on as Faust's
``stream_wait_empty=False`` would: their next owner processes them again, deduped)."""
HANDOVER_POLL_S = 0.1
UNFETCHED_GRACE_S = 10.0
"""A partition left out of the fetch this long after the group settled is resumed."""
HOLE_GRACE_S = 15.0
"""A partition whose commit is stuck behind records never handled this long is read again."""


class VoiceApp(faust.App):
    """Faust's app with a bounded handover wait, a fetch check and a stale-record guard
    (module docstring)."""

    def __init__(self, *args: Any, gapless_topics: Iterable[str] = (),
                 changelog_linger_s: float = 0.0, fetch_wait_ms: int | None = None,
                 **kwargs: Any) -> None:
        """``gapless_topics``: the topics that have no gaps of their own (not compacted,
        never written in transactions) — a gap Faust sees in one is a record it skipped.
        ``changelog_linger_s``: how long at most its tables hold a write back
        (``write_behind``). ``fetch_wait_ms``: how long at most the broker holds its fetch
        (``fetch_wait``; Faust's 1,500 ms when None)."""
        self.gapless_topics = frozenset(gapless_topics)
        self.fetch_wait_ms = fetch_wait_ms
        self.write_behind = WriteBehind(changelog_linger_s)
        """The tables' writes held back until a commit covers them (``send_before_commit``)."""
        self.commit_floor: CommitFloor | None = None
        """Made with the consumer (``_new_consumer``)."""
        super().__init__(*args, **kwargs)
        self.before_handover: list[Callable[[], None]] = []
        self.in_flight = InFlight()
        """The records this worker's agents are handling (``consumers.frame.failures``)."""
        self._unfetched_since: dict[Any, float] = {}
        self._holes_since: dict[Any, tuple[tuple[int, int], float]] = {}

    def _new_consumer(self) -> Any:
        consumer = super()._new_consumer()
        seek_on_consumer_thread(consumer)
        guard_stale_records(consumer, lambda: self.consumer_generation_id,
                            lambda: self.tables.changelog_topics,
                            lambda topic: topic in self.gapless_topics)
        self.commit_floor = CommitFloor(consumer, lambda: self.tables.changelog_topics,
                                        lambda topic: topic in self.gapless_topics)
        fetch_only_read_changelogs(consumer, lambda: self.tables.changelog_topics)
        send_before_commit(consumer, self.write_behind)
        if self.fetch_wait_ms is not None:
            hold_fetches_at_most(consumer, self.fetch_wait_ms)
        return consumer

    async def _producer_flush(self, logger: Any) -> None:
        # A handover or a stop (Faust's two callers): every held table write goes, first.
        self.write_behind.send()
        await super()._producer_flush(logger)

    async def _consumer_wait_empty(self, consumer: Any, logger: Any) -> None:  # noqa: ARG002
        for fn in self.before_handover:
            fn()
        deadline = time.monotonic() + HANDOVER_WAIT_S
        while (left := self.in_flight.records()) and time.monotonic() < deadline:
            await asyncio.sleep(HANDOVER_POLL_S)
        if left:
            log.warning("a handover went on after %.0f s with records in flight (their next "
                        "owner processes them again): %s", HANDOVER_WAIT_S,
                        ", ".join(f"{r.topic}[{r.partition}]@{r.offset}" for r in left[:5]))
        self.write_behind.send()  # the released leases' "running" too: the table is the lease
        await consumer.commit()

    async def reread_holes(self, now: float | None = None) -> list[Any]:
        """Seek back to its committed offset each partition ``holes`` has seen stuck for
        ``HOLE_GRACE_S`` (its records are read and handled again, deduped, as after a
        rebalance); returns them. Does nothing while a rebalance or a recovery runs."""
        now = time.monotonic() if now is None else now
        if self.rebalancing or self.in_recovery:
            self._holes_since.clear()
            return []
        c = self.consumer
        unacked = unacked_by_partition(c)
        assert self.commit_floor is not None  # made with the consumer, just above
        floors = {tp: self.commit_floor.floor(tp) for tp in c.assignment()}
        found = holes(c.assignment(), self.tables.changelog_topics, floors,
                      {tp: list(a) for tp, a in c._acked.items()}, dict(c._gap), unacked)
        self._holes_since = {tp: (found[tp], self._holes_since[tp][1])
                             if tp in self._holes_since and self._holes_since[tp][0] == found[tp]
                             else (found[tp], now) for tp in found}
        due = [tp for tp, (_, since) in self._holes_since.items() if now - since >= HOLE_GRACE_S]
        for tp in due:
            done, first = self._holes_since.pop(tp)[0]
            log.warning("%s[%s]: offsets %s..%s were read but never handled (the commit stays "
                        "at %s); reading again from there", tp.topic, tp.partition, done,
                        first - 1, done)
            c._acked.pop(tp, None)
            c._acked_index.pop(tp, None)
            try:
                await c.seek(tp, done)
            except Exception:  # a rebalance took it meanwhile: its next owner reads it
                log.exception("reading %s[%s] again failed", tp.topic, tp.partition)
        return due

    def snapshot(self) -> dict[str, Any]:
        """Where this worker's consumer stands, for an operator (``consumers.frame.state_dump``):
        rebalancing or recovering; the records its agents are handling, with how long; and per
        assigned partition (changelogs left out) the offset its commit stands at (``floor``),
        the first offsets handed out and not acknowledged (a lease, a record being handled:
        the commit cannot pass the first), and how many are acknowledged beyond it."""
        c = self.consumer
        logs = set(self.tables.changelog_topics)
        unacked = unacked_by_partition(c)
        partitions = {}
        for tp in sorted(c.assignment(), key=lambda tp: (tp.topic, tp.partition)):
            if tp.topic in logs:
                continue
            floor = self.commit_floor.floor(tp) if self.commit_floor is not None else None
            partitions[f"{tp.topic}[{tp.partition}]"] = {
                "floor": floor, "not_acknowledged": sorted(unacked.get(tp, []))[:5],
                "acknowledged": len(c._acked.get(tp, ()))}
        return {
            "rebalancing": bool(self.rebalancing), "in_recovery": bool(self.in_recovery),
            "in_flight": [f"{r.topic}[{r.partition}]@{r.offset} for {age:.1f} s"
                          for r, age in self.in_flight.ages()[:20]],
            "partitions": partitions,
        }

    def resume_unfetched(self, now: float | None = None) -> list[Any]:
        """Resume the partitions ``unfetched`` has seen left out for ``UNFETCHED_GRACE_S``;
        returns them. Does nothing while a rebalance or a recovery runs."""
        now = time.monotonic() if now is None else now
        if self.rebalancing or self.in_recovery:
            self._unfetched_since.clear()
            return []
        consumer = self.consumer
        left_out = unfetched(consumer.assignment(), self.tables.changelog_topics,
                             consumer._get_active_partitions(), consumer._buffered_partitions)
        self._unfetched_since = {tp: self._unfetched_since.get(tp, now) for tp in left_out}
        due = [tp for tp, since in self._unfetched_since.items()
               if now - since >= UNFETCHED_GRACE_S]
        if due:
            log.warning("resuming partitions assigned here but left out of the fetch: %s",
                        ", ".join(f"{tp.topic}[{tp.partition}]" for tp in due))
            consumer.resume_partitions(due)
            for tp in due:
                del self._unfetched_since[tp]
        return due


def unacked_by_partition(consumer: Any) -> dict[Any, set[int]]:
    """The offsets Faust's ``consumer`` has handed out and not seen acknowledged, by
    topic-partition."""
    unacked: dict[Any, set[int]] = {}
    for m in list(consumer._unacked_messages):
        unacked.setdefault(m.tp, set()).add(m.offset)
    return unacked


def unfetched(assigned: Iterable[Any], changelogs: Iterable[str], active: Iterable[Any],
              buffered: Iterable[Any]) -> set[Any]:
    """Assigned stream partitions (not changelogs, which recovery reads) that the fetcher
    neither reads (``active``) nor holds back for a full buffer (``buffered``)."""
    logs = set(changelogs)
    return {tp for tp in assigned if tp.topic not in logs} - set(active) - set(buffered)



def holes(assigned: Iterable[Any], changelogs: Iterable[str], committed: dict[Any, int | None],
          acked: dict[Any, list[int]], gaps: dict[Any, Any],
          unacked: dict[Any, set[int]]) -> dict[Any, tuple[int, int]]:
    """Assigned stream partitions whose commit can never move again: a commit passes only a
    run of acknowledged offsets starting at the committed one (``committed``: each one's
    floor, ``consumers.frame.commit_floor``), and here the offsets from the committed one up to
    the first acknowledged are neither acknowledged, nor being handled (``unacked``), nor a gap
    Faust skips — records read over and never handled. Returns each with ``(committed, first
    acknowledged)``."""
    logs = set(changelogs)
    found = {}
    for tp in assigned:
        done, offsets = committed.get(tp), acked.get(tp)
        if tp.topic in logs or done is None or not offsets or min(offsets) <= done:
            continue
        first = min(offsets)
        if any(done <= o < first for o in unacked.get(tp, ())):
            continue
        gap = gaps.get(tp)
        if gap and gap.overlaps(done, first):
            continue
        found[tp] = (done, first)
    return found

