"""A record fetched before a rebalance must not move its partition's read offset after it.

Faust's fetch loop (``Consumer._drain_messages``) hands each fetched record to the conductor,
then sets the partition's read offset to the record's offset; a later-fetched record below
the read offset is dropped as already read. A record fetched in one consumer generation can
reach that hand-over after the next generation has begun and sought the partition back to
its committed offset (the loop can wait in a commit right across a rebalance). The stream then
skips the record (its generation is old: ``faust.Stream`` drops it unacknowledged), but the
read offset still moves to it — so the records the seek fetches again, from the committed
offset up to that one, are all dropped: never handled, never acknowledged. Faust commits only
a run of acknowledged offsets that starts at the committed one, so the partition's commit
stops there for good, and the turns in those records never start (issue 12, fault 4: seen as
``acked`` starting five offsets past ``committed`` with nothing unacknowledged in between).

``guard_stale_records`` keeps such a record away from the conductor (the stream would skip it
anyway) and makes the read-offset update that follows it a no-op. Changelog partitions are
left alone: table recovery seeks them itself and reads them outside the streams.

**Holes** (the same fault, seen again as turns that never started): on a topic that has no
gaps of its own — not compacted, never written in transactions — Faust still skips offsets in
two ways. When the next record it fetches is more than one past the read offset, it registers
the offsets between as a gap (``Consumer._add_gap``), which counts as acknowledged: the commit
moves past records no handler ever saw. And after a seek the read offset means "next to read"
while after a hand-over it means "last read", so a record right after the committed one can
arrive first and the committed one is never handed over (Faust's commit check is off by one
the same way). The guard therefore also keeps, per partition of such a topic, the next offset
to hand over (set by every seek, moved by every hand-over); a record past it is held back and
the partition is sought back to it, once, so the records between are fetched and handed over
in order. Faust's gap is never registered for these topics.

**Before the generation's seek** (seen as a conversation's ``SendMessage`` decided before its
``StartConversation``, when a second worker joined: refused, and the start then skipped): Faust
resumes a partition's fetch before its seek to the committed offset has finished (the seek
waits on the group coordinator, a second or more on a busy broker), so records fetched from
wherever aiokafka stood were handed over first, out of order. A record of a gapless topic is
therefore handed over only once this generation's seek has set where its partition goes on
from; one fetched before is held back, and once the seek is done its partition is sought again
to where the seek set it (a record fetched after the seek moved the partition, and held back
before it was done, would come back no other way). A partition the seek names no offset for
goes on from the lowest record it held back, or else wherever its next record is.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection
from typing import Any

log = logging.getLogger(__name__)


class ReadOffsets(defaultdict[Any, int | None]):
    """Faust's ``Consumer._read_offset`` (a ``defaultdict`` of ``None``) that ignores the one
    update following a record marked ``stale`` — the fetch loop sets it right after the
    hand-over, with the same partition and offset."""

    def __init__(self, initial: dict[Any, int | None] | None = None) -> None:
        super().__init__(lambda: None)
        self._stale: dict[Any, int] = {}
        if initial:
            self.update(initial)

    def stale(self, tp: Any, offset: int) -> None:
        """The record at ``tp``/``offset`` was not handed over: do not count it as read."""
        self._stale[tp] = offset

    def __setitem__(self, tp: Any, offset: int | None) -> None:
        if offset is not None and self._stale.get(tp) == offset:
            del self._stale[tp]
            return
        super().__setitem__(tp, offset)


REWIND_GIVE_UP_S = 30.0
"""A partition sought back to a hole that still has not handed over the hole's first record
after this long (the records are gone: retention) goes on past it, registered as Faust's gap."""


def guard_stale_records(consumer: Any, generation: Callable[[], int],
                        changelogs: Callable[[], Collection[str]],
                        gapless: Callable[[str], bool] = lambda topic: False) -> None:
    """Install the guard on Faust's ``consumer`` before its fetch loop starts (the loop binds
    ``callback`` and the read-offset mapping once). ``generation`` is the app's current
    consumer generation, ``changelogs`` the tables' changelog topics, ``gapless`` whether a
    topic can have no gaps of its own (module docstring: holes)."""
    offsets = ReadOffsets(dict(consumer._read_offset))
    consumer._read_offset = offsets
    deliver: Callable[[Any], Awaitable[None]] = consumer.callback
    add_gap: Callable[[Any, int, int], Awaitable[None]] = consumer._add_gap
    seek: Callable[[Any, int], Awaitable[None]] = consumer.seek
    perform_seek: Callable[[], Awaitable[None]] = consumer.perform_seek
    following: dict[Any, tuple[int, int]] = {}
    """The next offset to hand over of each gapless partition, with its generation."""
    rewinding: dict[Any, tuple[int, float]] = {}
    """Each partition sought back to a hole: the hole's first offset, since when."""
    held_early: dict[Any, tuple[int, int]] = {}
    """Each partition that held records back for its generation's seek: that generation, the
    lowest offset held."""
    awaiting_seek: dict[Any, tuple[int, float]] = {}
    """Each partition holding records back for its generation's seek: that generation, since
    when."""
    first_handed: dict[Any, int] = {}
    """Each gapless partition's generation whose first hand-over is logged (``info``)."""

    async def seek_and_follow(tp: Any, offset: int) -> None:
        await seek(tp, offset)
        if gapless(tp.topic):
            following[tp] = (offset, generation())

    async def perform_seek_and_follow() -> None:
        now = generation()  # the generation this seek is for (a rebalance may start meanwhile)
        await perform_seek()
        for tp, offset in list(consumer._committed_offset.items()):
            if offset is not None and gapless(tp.topic):
                following[tp] = (offset, now)
        if log.isEnabledFor(logging.INFO):  # what a takeover reads from, for its post-mortem
            log.info("generation %s: sought to %s (each partition's committed offset, or its "
                     "first if never committed); held back before it: %s", now,
                     _where(following, now),
                     _where({tp: (low, of) for tp, (of, low) in held_early.items()}, now))
        for tp in consumer.assignment():
            if gapless(tp.topic) and following.get(tp, (None, None))[1] != now:
                following[tp] = (None, now)  # no offset named: from its next record
        for tp, (of, lowest) in list(held_early.items()):
            # Held back while this seek ran — possibly fetched after its seek moved the
            # partition, so no fetch brings them again by itself: seek once more.
            del held_early[tp]
            if of == now and tp in following:
                expected = following[tp][0]
                target = lowest if expected is None else expected
                try:
                    await seek_and_follow(tp, target)
                except Exception:  # a rebalance took it meanwhile: its next owner reads it
                    log.exception("reading %s[%s] again from %s failed", tp.topic,
                                  tp.partition, target)

    async def no_gap_here(tp: Any, offset_from: int, offset_to: int) -> None:
        if not gapless(tp.topic):
            await add_gap(tp, offset_from, offset_to)
        # else: never counted as acknowledged; ``callback`` holds the record back instead

    async def callback(message: Any) -> None:
        now = generation()
        tp = message.tp
        if message.generation_id != now and message.topic not in changelogs():
            offsets.stale(tp, message.offset)
            log.warning("a record fetched before the rebalance came after it, not handed "
                        "over (read again from the committed offset): %s[%s]@%s, generation "
                        "%s, now %s", message.topic, message.partition, message.offset,
                        message.generation_id, now)
            return
        if gapless(message.topic):
            expected, of = following.get(tp, (None, None))
            if of != now and not seek_overdue(tp, now):
                offsets.stale(tp, message.offset)  # read again after this generation's seek
                was, lowest = held_early.get(tp, (now, message.offset))
                held_early[tp] = (now, min(lowest, message.offset) if was == now
                                  else message.offset)
                return
            if expected is not None and message.offset > expected:
                if not await rewound(tp, expected, message):
                    offsets.stale(tp, message.offset)
                    return
            following[tp] = (message.offset + 1, now)
            rewinding.pop(tp, None)
            if first_handed.get(tp) != now:
                first_handed[tp] = now
                log.info("generation %s: %s[%s] first hands over offset %s", now,
                         message.topic, message.partition, message.offset)
        await deliver(message)

    def seek_overdue(tp: Any, now: int) -> bool:
        """Whether ``tp`` has waited ``REWIND_GIVE_UP_S`` in generation ``now`` for a seek
        that never came (Faust seeks after every rebalance's recovery; this is a backstop
        that keeps a partition from stalling for good): it then goes on as it stands."""
        of, since = awaiting_seek.get(tp, (None, 0.0))
        if of != now:
            awaiting_seek[tp] = (now, time.monotonic())
            return False
        if time.monotonic() - since < REWIND_GIVE_UP_S:
            return False
        log.error("%s[%s]: no seek in generation %s after %.0f s; going on from offset %s",
                  tp.topic, tp.partition, now, REWIND_GIVE_UP_S, offsets.get(tp))
        following[tp] = (None, now)
        return True

    async def rewound(tp: Any, expected: int, message: Any) -> bool:
        """Whether to hand ``message`` over past the hole ``expected``..its offset: no while
        the partition is (being) sought back to the hole; yes once that has not filled it
        for ``REWIND_GIVE_UP_S``."""
        target, since = rewinding.get(tp, (None, 0.0))
        if target == expected:
            if time.monotonic() - since < REWIND_GIVE_UP_S:
                return False  # fetched before the seek back: read again after it
            log.error("%s[%s]: offsets %s..%s are not on the log (sought back for %.0f s); "
                      "going on from %s", tp.topic, tp.partition, expected, message.offset - 1,
                      REWIND_GIVE_UP_S, message.offset)
            await add_gap(tp, expected, message.offset)
            return True
        log.warning("%s[%s]: offset %s came before %s..%s were handed over; reading again "
                    "from %s", tp.topic, tp.partition, message.offset, expected,
                    message.offset - 1, expected)
        rewinding[tp] = (expected, time.monotonic())
        try:
            await seek_and_follow(tp, expected)
        except Exception:  # a rebalance took the partition meanwhile: its next owner reads it
            log.exception("reading %s[%s] again from %s failed", tp.topic, tp.partition,
                          expected)
            rewinding.pop(tp, None)
        return False

    consumer.callback = callback
    consumer._add_gap = no_gap_here
    consumer.seek = seek_and_follow
    consumer.perform_seek = perform_seek_and_follow


def _where(offsets: dict[Any, tuple[int | None, int]], generation: int) -> str:
    """``topic[partition]@offset`` of each partition ``offsets`` names for ``generation``
    (with an offset), sorted; for a log line."""
    found = sorted(f"{tp.topic}[{tp.partition}]@{offset}"
                   for tp, (offset, of) in offsets.items() if of == generation
                   and offset is not None)
    return ", ".join(found) or "none"
