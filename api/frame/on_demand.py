"""Stream views held while in use and read from the log when asked for (decision 0011).

An edge started with ``VOICE_EDGE_HISTORY_S`` reads its conversation logs (a participant's,
``voice.conversations``; an assistant's, ``voice.assistant``) only from that far back, and
holds only the conversations in use. ``OnDemandViews`` is that holding, once for every such
projection:

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
nothing is evicted. Everything runs on the edge's event loop; the read itself in a thread.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from api.frame.projection import DEFAULT_KEPT, K, StreamProjection
from streams.envelope import Envelope

ColdRead = Callable[[str], list[Envelope]]
"""Blocking: every record of one conversation up to its partition's end when the read begins,
in log order (``api.frame.cold.key_reader``)."""

ABSENT_KEPT = 10_000
"""Ids found in no record before the window, remembered so that asking again scans nothing."""
COLD_SCANS = 1
"""Partition scans at once (the reader runs one at a time; more would only hold threads)."""
COLD_WAIT_S = 120.0
"""Longest ``ensure`` waits for a read by default (the reader gives up at its own 60 s; a
request passes what is left of its gateway bound)."""


class OnDemandViews(StreamProjection[K]):
    """A ``StreamProjection`` that, with a ``cold`` reader, holds only the views in use."""

    FOUNDED_BY: ClassVar[type]
    """The record that makes a view (a conversation's start): a read that finds none of it
    found no such aggregate."""

    def __init__(self, kept: int = DEFAULT_KEPT, cold: ColdRead | None = None) -> None:
        super().__init__(kept)
        self.cold = cold
        self.pending: dict[str, list[Envelope]] = {}
        """Records the tail brought for a key while it is being read from the log
        (``_loading``): applied after the read."""
        self._absent: OrderedDict[str, None] = OrderedDict()
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._streaming: Counter[str] = Counter()
        self._scans = asyncio.Semaphore(COLD_SCANS)

    def apply(self, env: Envelope) -> Any:
        """Apply one record of the log (each projection's own)."""
        raise NotImplementedError

    def held_back(self, env: Envelope) -> None:
        """What ``apply`` does with a record whose view is not in memory: held for the read
        of its key under way (applied after it), else dropped."""
        if env.key in self._loading:
            self.pending.setdefault(env.key, []).append(env)

    async def ensure(self, key: str, timeout: float = COLD_WAIT_S) -> bool:
        """Read ``key``'s records from before the window, once, if this edge has not; waits
        at most ``timeout`` and says whether that is settled (False: still reading)."""
        if self.cold is None or key in self._absent:
            return True
        view = self.by_key.get(key)
        if view is not None:
            view.used_at = time.monotonic()
            return True
        fut = self._loading.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._load(key))
            self._loading[key] = fut
            fut.add_done_callback(lambda f: self._read_done(key, f))
        # Until the read is done — or the tail brings the view first (a conversation just
        # started, on another edge): then the read ends on its own, nobody waits for it. A
        # caller that goes away cancels its wait, never the read others wait on.
        settled = await self.wait(key, lambda v: v is not None or fut.done(), timeout)
        if fut.done():
            fut.result()  # ColdReadFailed, when the read failed
        return settled

    def _read_done(self, key: str, fut: asyncio.Future[None]) -> None:
        self._loading.pop(key, None)
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
            if not any(isinstance(env.record, self.FOUNDED_BY) for env in older):
                self._absent[key] = None  # no such aggregate: what was held is orphaned
                while len(self._absent) > ABSENT_KEPT:
                    self._absent.popitem(last=False)
                return
            for env in (*older, *self.pending.pop(key, ())):
                self.apply(env)
        finally:
            self.pending.pop(key, None)
            self.notify(key)  # wake ``ensure``'s waiters, whatever the outcome

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

    def evict_idle(self, idle_s: float, now: float | None = None) -> int:
        """Drop the views unused for ``idle_s`` — no request asked for them, no record changed
        them, no stream is open, nobody waits — when this edge reads cold ones from the log (a
        later request reads them again); how many were dropped. Without a cold reader nothing
        is dropped: the edge holds all history (decision 0011, step 4)."""
        if self.cold is None:
            return 0
        before = (time.monotonic() if now is None else now) - idle_s
        idle = [key for key, view in self.by_key.items()
                if view.used_at < before and key not in self._streaming
                and key not in self._loading and not self.waiting(key)]
        for key in idle:
            del self.by_key[key]
        return len(idle)
