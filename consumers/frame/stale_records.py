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
"""

from __future__ import annotations

import logging
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


def guard_stale_records(consumer: Any, generation: Callable[[], int],
                        changelogs: Callable[[], Collection[str]]) -> None:
    """Install the guard on Faust's ``consumer`` before its fetch loop starts (the loop binds
    ``callback`` and the read-offset mapping once). ``generation`` is the app's current
    consumer generation, ``changelogs`` the tables' changelog topics."""
    offsets = ReadOffsets(dict(consumer._read_offset))
    consumer._read_offset = offsets
    deliver: Callable[[Any], Awaitable[None]] = consumer.callback

    async def callback(message: Any) -> None:
        now = generation()
        if message.generation_id != now and message.topic not in changelogs():
            offsets.stale(message.tp, message.offset)
            log.warning("a record fetched before the rebalance came after it, not handed "
                        "over (read again from the committed offset): %s[%s]@%s, generation "
                        "%s, now %s", message.topic, message.partition, message.offset,
                        message.generation_id, now)
            return
        await deliver(message)

    consumer.callback = callback
