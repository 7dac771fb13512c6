"""Nothing is committed past a record no handler saw: where a partition's reading starts, and
the lowest offset its commit may pass.

Faust's consumer keeps each partition's committed offset as Kafka does — the next offset to
read — but two of its checks use it as if it were the last offset read, and it has none at all
for a partition never committed:

1. **Its commit** (``Consumer._new_offset``) commits the run of acknowledged offsets that starts
   *at most one past* the committed offset, so the record *at* the committed offset, never
   acknowledged, was committed past. With nothing committed (or 0, which it keeps as none) it
   commits from whatever was acknowledged first.
2. **Its seek** after a rebalance (aiokafka's ``seek_to_committed``) moves a partition only to a
   committed offset above 0. A partition with none stayed where the last fetch left it — past
   the records Faust dropped while it held the partition paused or its flow stopped, which it
   relies on that seek to read again.

Seen as a turn whose ``WorkflowStarted``, the only record of its partition, was never handled
when a second worker joined; and as a conversation whose ``StartConversation`` sat at its
partition's committed offset, skipped while the records after it were handled and committed.

``CommitFloor`` mends both for the stream topics that have no gaps of their own (the others are
left to Faust): each seek sends a partition with no commit to its first offset, which it then
keeps as that partition's floor; and a commit is held back while the lowest acknowledged offset
is above the floor (the committed offset, or that first offset) and no gap Faust registered
covers it. A record left so is read again by ``VoiceApp.reread_holes``, which asks ``floor``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any


class CommitFloor:
    """Installed on Faust's consumer (``VoiceApp._new_consumer``); see the module docstring."""

    def __init__(self, consumer: Any, changelogs: Callable[[], Collection[str]],
                 gapless: Callable[[str], bool]) -> None:
        """``changelogs``: the tables' changelog topics (recovery reads them itself);
        ``gapless``: whether a topic has no gaps of its own."""
        self.consumer = consumer
        self.changelogs = changelogs
        self.gapless = gapless
        self.starts: dict[Any, int] = {}
        """Each partition with no commit, sought to its first offset: that offset."""
        self._seek_to_committed: Callable[[], Awaitable[dict[Any, int | None]]] = \
            consumer.seek_to_committed
        self._new_offset: Callable[[Any], int | None] = consumer._new_offset
        consumer.seek_to_committed = self.seek_to_committed
        consumer._new_offset = self.new_offset

    def floor(self, tp: Any) -> int | None:
        """The lowest offset ``tp``'s commit may pass only once it is acknowledged (None:
        not known; Faust decides)."""
        committed = self.consumer._committed_offset.get(tp)
        return committed if committed else self.starts.get(tp, committed)

    async def seek_to_committed(self) -> dict[Any, int | None]:
        """Faust's seek, then each assigned partition of a gapless topic with no commit (or 0)
        sought to its first offset; returns what Faust's returned (its view is unchanged)."""
        committed = await self._seek_to_committed()
        logs = set(self.changelogs())
        fresh = [tp for tp, offset in committed.items()
                 if not offset and tp.topic not in logs and self.gapless(tp.topic)]
        for tp, offset in committed.items():
            if offset:
                self.starts.pop(tp, None)
        if fresh:
            starts = await self.consumer.earliest_offsets(*fresh)
            for tp in fresh:
                start = starts.get(tp)
                if start is not None and start >= 0:
                    await self.consumer.seek(tp, start)
                    self.starts[tp] = start
        return committed

    def new_offset(self, tp: Any) -> int | None:
        """Faust's next offset to commit for ``tp``, or None while the record at its floor
        is not acknowledged (and no gap Faust registered covers it)."""
        acked = self.consumer._acked.get(tp)
        if acked and self.gapless(tp.topic):
            floor = self.floor(tp)
            if floor is not None and min(acked) > floor:
                gap = self.consumer._gap.get(tp)
                if not (gap and gap.overlaps_point(floor)):
                    return None
        return self._new_offset(tp)
