"""Stream views held while in use and read from the log when asked for (decision 0011).

An edge started with ``VOICE_EDGE_HISTORY_S`` reads its conversation logs (a participant's,
``voice.conversations``; an assistant's, ``voice.assistant``) only from that far back, and
holds only the conversations in use. ``OnDemandViews`` is that holding, once for every such
projection (its read on demand, ``ReadOnDemand``, serves the staff view's turn workflows too):

- one started before the window, or evicted after a window unused (``evict_idle``), has no view
  until it is asked for (``ensure``); then its records are read from its partition of the log,
  up to the partition's end (``cold``: ``api.frame.cold``), and applied, then the records the
  tail brought meanwhile (held in ``pending`` while the read runs) — each once, by seq, in
  order;
- records of a conversation neither in memory nor being read are dropped (``held_back`` says
  so): the read gets them from the log when it is asked for;
- an id no record founds is remembered (``ABSENT_KEPT``), so asking again scans nothing;
- a view with an open stream (``streaming``), a waiter or a read under way is never evicted.

Without a ``cold`` reader the projection holds all history: ``ensure`` has nothing to load and
nothing is evicted.

With a ``gap`` reader (every edge, windowed or not), a stream's cursor older than the events a
view keeps is served from the log (decision 0011, step 5): ``older`` reads the positions
between it and the oldest kept one — each exactly once, in order, or ``ColdReadFailed``, never a
stream with a hole — one read per range, shared by every asker and remembered for the next
few. A position is a stream's cursor: a conversation's seq, an assistant chat's display seq
(``positions``). Everything runs on the edge's event loop; the reads themselves in a thread.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Protocol

from api.frame.cold import ColdReadFailed
from api.frame.projection import DEFAULT_KEPT, K, Projection, StreamProjection, V
from streams.envelope import Envelope

ColdRead = Callable[[str], list[Envelope]]
"""Blocking: every record of one conversation up to its partition's end when the read begins,
in log order (``api.frame.cold.key_reader``)."""


class ColdGap(Protocol):
    """Blocking: one conversation's records at positions in ``(after, upto]`` from anywhere in
    the log (``api.frame.cold.gap_reader``) — from ``since_ms`` on when given (no record of
    them is older) — what a cursor or page older than the kept events needs."""

    def __call__(self, key: str, after: int, upto: int, since_ms: int | None = None
                 ) -> list[Envelope]: ...


GAPS_KEPT = 16
"""Gap reads remembered (by key and range): a client whose stream ends while one is read
reconnects with the same cursor and gets its result, not a second scan."""

ABSENT_KEPT = 10_000
"""Ids found in no record before the window, remembered so that asking again scans nothing."""
COLD_SCANS = 1
"""Partition scans at once (the reader runs one at a time; more would only hold threads)."""
COLD_WAIT_S = 120.0
"""Longest ``ensure`` waits for a read by default (the reader gives up at its own 60 s; a
request passes what is left of its gateway bound)."""


class ReadOnDemand(Projection[V]):
    """A ``Projection`` whose views, with a ``cold`` reader, are read from the log when asked
    for (``ensure``) and not found in memory: once, by every asker at once, with the records the
    tail brings meanwhile held (``held_back``) and applied after; an id no record founds is
    remembered (``ABSENT_KEPT``). ``OnDemandViews`` (the conversation logs) and the staff
    view's turn workflows (``api.staff.views.Workflows``) are such projections.

    Cooperative: ``cold`` is a keyword, every other argument goes on to the next base."""

    FOUNDED_BY: ClassVar[type]
    """The record that makes a view (a conversation's start): a read that finds none of it
    found no such aggregate."""

    def __init__(self, *args: Any, cold: ColdRead | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cold = cold
        self.pending: dict[str, list[Envelope]] = {}
        """Records the tail brought for a key while it is being read from the log
        (``_loading``): applied after the read."""
        self._absent: OrderedDict[str, None] = OrderedDict()
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._scans = asyncio.Semaphore(COLD_SCANS)

    def apply(self, env: Envelope) -> Any:
        """Apply one record of the log (each projection's own)."""
        raise NotImplementedError

    def readable(self, key: str) -> bool:
        """Whether a read from the log can find ``key`` (every key, unless a projection says
        otherwise)."""
        return True

    def used(self, view: V) -> None:
        """``ensure`` found ``view`` in memory (a projection that evicts notes the use)."""

    def last_used(self, view: V) -> float:
        """When ``view`` was last used (``time.monotonic``): what ``evict_idle`` goes by (a
        projection that evicts says)."""
        raise NotImplementedError

    def in_use(self, key: str) -> bool:
        """Whether ``key``'s view must stay in memory however long unused: a read of it runs,
        or someone waits on it."""
        return key in self._loading or bool(self.waiting(key))

    def held_back(self, key: str, env: Envelope) -> None:
        """What ``apply`` does with a record whose view is not in memory: held for the read
        of its key under way (applied after it), else dropped."""
        if key in self._loading:
            self.pending.setdefault(key, []).append(env)

    def let_go(self, key: str) -> None:
        """Drop ``key``'s view from memory (evicted, or ended and no longer kept): asked for
        again, it is read again."""
        del self.by_key[key]
        self._absent.pop(key, None)  # founded since it was asked for: no longer absent

    def evict_idle(self, idle_s: float, now: float | None = None) -> int:
        """Drop the views unused for ``idle_s`` — no request asked for them, no record changed
        them, none ``in_use`` — when this edge reads cold ones from the log (a later request
        reads them again); how many were dropped. Without a cold reader nothing is dropped:
        the edge holds all history (decision 0011, step 4)."""
        if self.cold is None:
            return 0
        before = (time.monotonic() if now is None else now) - idle_s
        idle = [key for key, view in self.by_key.items()
                if self.last_used(view) < before and not self.in_use(key)]
        for key in idle:
            self.let_go(key)
        return len(idle)

    async def ensure(self, key: str, timeout: float = COLD_WAIT_S) -> bool:
        """Read ``key``'s records from the log, once, if this edge does not hold its view;
        waits at most ``timeout`` and says whether that is settled (False: still reading).
        ``ColdReadFailed`` when the read failed (asked again, it is tried again)."""
        view = self.by_key.get(key)
        if view is not None:
            self.used(view)
            return True
        if self.cold is None or key in self._absent or not self.readable(key):
            return True
        fut = self._loading.get(key)
        if fut is None or fut.done():  # done: a failed read not yet cleared; try again
            fut = self._loading[key] = asyncio.ensure_future(self._load(key))
            fut.add_done_callback(lambda f: self._read_done(key, f))
        # Until the read is done — or the tail brings the view first (a conversation just
        # started, on another edge): then the read ends on its own, nobody waits for it. A
        # caller that goes away cancels its wait, never the read others wait on.
        settled = await self.wait(key, lambda v: v is not None or fut.done(), timeout)
        if fut.done():
            fut.result()  # ColdReadFailed, when the read failed
        return settled

    def _read_done(self, key: str, fut: asyncio.Future[None]) -> None:
        if self._loading.get(key) is fut:
            del self._loading[key]
        if not fut.cancelled():
            fut.exception()  # retrieved: a failure nobody waits for any more is no warning

    async def _load(self, key: str) -> None:
        assert self.cold is not None
        try:
            async with self._scans:
                if key in self.by_key:
                    return
                older = await asyncio.to_thread(self.cold, key)
            # Back on the loop, in one step: the tail applies nothing in between.
            if key in self.by_key:
                return
            # A founding record may come by the tail while the read runs (held for after it).
            if not any(isinstance(env.record, self.FOUNDED_BY)
                       for env in (*older, *self.pending.get(key, ()))):
                self._absent[key] = None  # no such aggregate: what was held is orphaned
                while len(self._absent) > ABSENT_KEPT:
                    self._absent.popitem(last=False)
                return
            # In log order, its founding record first; then what the tail brought since.
            for env in (*older, *self.pending.pop(key, ())):
                self.apply(env)
        finally:
            self.pending.pop(key, None)
            self.notify(key)  # wake ``ensure``'s waiters, whatever the outcome


class OnDemandViews(ReadOnDemand[K], StreamProjection[K]):
    """A ``StreamProjection`` that, with a ``cold`` reader, holds only the views in use."""

    POSITION: ClassVar[str] = "position"
    """What a position is called in an error (a conversation's seq)."""
    FOLDED_BACK: ClassVar[int] = 0
    """How many positions before a range a record holding some of it may start (a folded
    record's): a gap read starts that much earlier."""

    def __init__(self, kept: int = DEFAULT_KEPT, cold: ColdRead | None = None,
                 gap: ColdGap | None = None) -> None:
        super().__init__(kept, cold=cold)
        self.gap = gap
        """Reads events older than a view keeps, for an old cursor (None: 409 instead)."""
        self._gaps: OrderedDict[tuple[str, int, int],
                                asyncio.Future[list[tuple[int, Envelope]]]] = OrderedDict()
        self._streaming: Counter[str] = Counter()

    @staticmethod
    def positions(env: Envelope) -> Iterable[tuple[int, Envelope]]:
        """The stream positions a record holds, each with the record that stands there."""
        raise NotImplementedError

    def used(self, view: K) -> None:
        view.used_at = time.monotonic()

    def last_used(self, view: K) -> float:
        return view.used_at

    def in_use(self, key: str) -> bool:
        """Also while a stream of it is open."""
        return super().in_use(key) or key in self._streaming

    async def older(self, key: str, after: int, upto: int, share: bool = True,
                    since_ms: int | None = None) -> list[Envelope]:
        """The records at positions ``(after, upto]`` of ``key`` — those before the oldest its
        view keeps — read from the log: each position exactly once, in order, or
        ``ColdReadFailed``. One read per range, shared by every asker and remembered for the
        next few — unless not ``share``: a transcript page's read is its own, never kept.
        ``since_ms``: no record of the range is older, the scan starts there."""
        if self.gap is None:
            raise ColdReadFailed("this edge reads no events older than it keeps")
        view = self.by_key.get(key)
        tenant = None if view is None else view.tenant
        fut = (self._shared(key, after, upto) if share
               else asyncio.ensure_future(self._read_gap(key, after, upto, since_ms)))
        found = [env for at, env in await asyncio.shield(fut) if at > after]
        if any(env.tenant != tenant for env in found):
            raise ColdReadFailed(f"conversation {key}: records of another tenant in the log")
        return found

    def _shared(self, key: str, after: int, upto: int
                ) -> asyncio.Future[list[tuple[int, Envelope]]]:
        """The read of ``(after, upto]`` under way or remembered — a read of the same range,
        or of a wider one (a lower ``after``), serves this one: clients resuming at
        different old cursors of one stream share one scan — else a new one."""
        for (k, a, u), f in self._gaps.items():
            if k == key and u == upto and a <= after and not (
                    f.done() and (f.cancelled() or f.exception() is not None)):
                return f
        fut = asyncio.ensure_future(self._read_gap(key, after, upto))
        self._gaps[(key, after, upto)] = fut
        while len(self._gaps) > GAPS_KEPT:
            self._gaps.popitem(last=False)
        return fut

    async def _read_gap(self, key: str, after: int, upto: int, since_ms: int | None = None
                        ) -> list[tuple[int, Envelope]]:
        assert self.gap is not None
        async with self._scans:
            # From a few positions earlier: a folded record before ``after`` may hold some after.
            found = await asyncio.to_thread(self.gap, key, max(0, after - self.FOLDED_BACK),
                                            upto, since_ms)
        by_position: dict[int, Envelope] = {}
        for env in found:
            for at, part in self.positions(env):
                by_position.setdefault(at, part)  # a redelivered record: the first one
        missing = [at for at in range(after + 1, upto + 1) if at not in by_position]
        if missing:
            raise ColdReadFailed(f"conversation {key}: the log no longer holds {self.POSITION} "
                                 f"{missing[0]}"
                                 + (f" and {len(missing) - 1} more" if len(missing) > 1
                                    else ""))
        return [(at, by_position[at]) for at in range(after + 1, upto + 1)]

    @contextmanager
    def streaming(self, key: str) -> Iterator[None]:
        """While a stream of ``key`` is open, its view is never evicted."""
        self._streaming[key] += 1
        try:
            yield
        finally:
            self._streaming[key] -= 1
            if self._streaming[key] <= 0:
                del self._streaming[key]
            view = self.by_key.get(key)
            if view is not None:
                view.used_at = time.monotonic()
