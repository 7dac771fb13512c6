"""A participant's conversations in the order they started, a page at a time.

Start order: every id that carries its time (``streams.ids.has_time``: all of one length, so
their text sorts them by time) after every older id without one, each kind by its text — a
total order, so a page's cursor (``before``: a conversation id) is exact. ``StartOrdered``
keeps one owner's ids sorted as they come (the index by owner's entries, in
``api.conversations.owners``); ``newest_before`` walks such lists newest first and takes a page,
asking ``listed`` (not erased) of as few ids as the page needs. A participant with ~90,000
conversations cost a full sort and a key ring check of each, ~60 ms of the event loop, every
time they listed; a page now costs its own size.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from streams.ids import has_time


@dataclass
class StartOrdered:
    """Conversation ids in start order: those with their time and those without, each
    sorted, each id once."""

    timed: list[str] = field(default_factory=list)
    untimed: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, conversations: Iterable[str]) -> StartOrdered:
        ordered = cls()
        for c in conversations:
            (ordered.timed if has_time(c) else ordered.untimed).append(c)
        ordered.timed.sort()
        ordered.untimed.sort()
        return ordered

    def add(self, conversation: str) -> bool:
        """Put ``conversation`` in its place (at the end, when it is the newest); False when
        it was there already."""
        into = self.timed if has_time(conversation) else self.untimed
        at = bisect.bisect_left(into, conversation)
        if at < len(into) and into[at] == conversation:
            return False
        into.insert(at, conversation)
        return True

    def __len__(self) -> int:
        return len(self.timed) + len(self.untimed)

    def __iter__(self) -> Iterator[str]:
        """Every id, in start order."""
        yield from self.untimed
        yield from self.timed


def newest_before(sources: Iterable[StartOrdered], before: str | None, limit: int,
                  listed: Callable[[str], bool]) -> tuple[list[str], bool]:
    """The newest ``limit`` ids of ``sources`` (together, each id once) that started before
    ``before`` (all, without it) and are ``listed``, in start order; and whether a listed one
    older than them remains."""
    sources = list(sources)
    timed_below: str | None = before
    untimed_below: str | None = None  # every id without a time is older than one with
    if before is not None and not has_time(before):
        timed_below, untimed_below = "", before  # no id with a time is older
    page: list[str] = []
    for lists, below in (([s.timed for s in sources], timed_below),
                         ([s.untimed for s in sources], untimed_below)):
        for c in _descending(lists, below):
            if listed(c):
                page.append(c)
                if len(page) > limit:
                    return page[:limit][::-1], True
    return page[::-1], False


def _descending(lists: list[list[str]], below: str | None) -> Iterator[str]:
    """The ids of the sorted ``lists`` below ``below`` (all, without it), largest first,
    each once."""
    def down(lst: list[str]) -> Iterator[str]:
        end = len(lst) if below is None else bisect.bisect_left(lst, below)
        return (lst[i] for i in range(end - 1, -1, -1))

    last = None
    for c in heapq.merge(*(down(lst) for lst in lists), reverse=True):
        if c != last:
            yield c
            last = c
