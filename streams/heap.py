"""The garbage collector of a long-running Voice process (worker, edge, telemetry sink).

Python's full collection runs whenever a quarter as many objects as its oldest generation
holds have survived two young collections, and it walks that whole generation at once: the
modules, models, routes and clients a process loads at start (~95,000 objects in an edge,
~230,000 in a worker) as well as what it made since. In the bench's stack (docs/benchmarks.md,
"Issue 14, seventh pass") such collections stopped a running worker for ~200 ms and an edge
for 170–265 ms, every request and stream of that process waiting.

``settle_heap`` is called once a process is built: what it holds then lives as long as the
process anyway, so it is frozen out of every later collection (``gc.freeze``), and later full
collections walk only what was made after (19–64 ms in the same runs). The young collections
keep Python's thresholds: fewer of them (10,000 allocations apart instead of 700) cut the
worker's time in the collector by ~40 % but cost more CPU per turn than it saved, in 5 of 6 pairs.

What a process makes after it is built still grows with what it holds: an edge's open streams
(~125 objects each) and the events its views keep (3 each). An edge holding 5,000 streams as
browsers hold them (each ended before the gateway bound and opened again, ~350 a second) made
12 full collections a minute of up to 721 ms, 13 % of its time stopped — and none of them
found anything to collect: what it holds is freed by its reference counts as it goes
(docs/benchmarks.md, "Issue 14, fifteenth pass"). So ``FullCollections`` freezes what survives
each full collection too: the next one walks only what survived since (the streams opened
meanwhile), not everything held. What it freezes and later drops is freed as before; only a
cycle among frozen objects waits, for the next whole walk: the first full collection
``WHOLE_WALK_S`` or more after the last whole walk unfreezes everything first. It also logs
every full collection that stops the process for ``LONG_PAUSE_MS`` or more.

An edge also runs its full collection itself while it is idle, no request coming in and no
record applied (``collect_when_idle``), so that Python's own does not fall due inside the next
burst of events.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

LONG_PAUSE_MS = 50.0
"""A full collection at least this long is logged (a warning)."""
WHOLE_WALK_S = 600.0
"""The first full collection this long or more after the last whole walk walks everything
the process holds (the ones between walk what survived since the last full collection)."""
IDLE_S = 0.2
"""``collect_when_idle``: how long a process must have had nothing to do before it collects."""


class FullCollections:
    """A ``gc.callbacks`` entry for the process's full (oldest generation) collections.

    With ``freeze_survivors``, what survives one is frozen (``gc.freeze``), so the next walks
    only what survived since; a full collection ``whole_walk_s`` or more after the last whole
    one unfreezes everything first, so it walks (and frees any cycle among) all of it.

    It counts them (``count``, ``total_ms``, ``longest_ms``) and logs one of ``over_ms`` or more
    with the objects that survived it."""

    def __init__(self, over_ms: float = LONG_PAUSE_MS,
                 clock: Callable[[], float] = time.perf_counter,
                 freeze_survivors: bool = False, whole_walk_s: float = WHOLE_WALK_S) -> None:
        self.over_ms = over_ms
        self.freeze_survivors = freeze_survivors
        self.whole_walk_s = whole_walk_s
        self._clock = clock
        self._started: float | None = None
        self._whole = False
        self._last_whole = clock()
        self.count = 0
        self.whole_walks = 0
        self.total_ms = 0.0
        self.longest_ms = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        now = self._clock()
        if phase == "start":
            self._whole = (self.freeze_survivors
                           and now - self._last_whole >= self.whole_walk_s)
            if self._whole:
                gc.unfreeze()  # into the oldest generation, which this collection walks
            self._started = now
            return
        if self._started is None:  # installed during a collection
            return
        ms = (now - self._started) * 1000
        self._started = None
        self.count += 1
        self.total_ms += ms
        self.longest_ms = max(self.longest_ms, ms)
        if ms >= self.over_ms:
            log.warning("a full garbage collection stopped this process for %.0f ms%s: "
                        "%d objects survived it (every request and stream of it waited)",
                        ms, " (a whole walk)" if self._whole else "", len(gc.get_objects(2)))
        if self.freeze_survivors:
            gc.freeze()
            if self._whole:
                self.whole_walks += 1
                self._last_whole = now


WATCH = FullCollections(freeze_survivors=True)
"""This process's watch (``settle_heap`` starts it)."""


def settle_heap() -> None:
    """Freeze what the process holds now out of later collections, and watch the later full
    collections (``WATCH``: what survives each is frozen too; one at least ``WHOLE_WALK_S``
    after the last walks everything). Call once, when the process is built."""
    gc.collect()
    gc.freeze()
    if WATCH not in gc.callbacks:
        gc.callbacks.append(WATCH)


async def collect_when_idle(busy_at: Callable[[], float], idle_s: float = IDLE_S,
                            every_s: float = IDLE_S / 2,
                            counts: Callable[[], tuple[int, int, int]] = gc.get_count,
                            collect: Callable[[], object] = gc.collect) -> None:
    """Run a full collection whenever the process has had nothing to do for ``idle_s``
    (``busy_at()``: the ``time.monotonic()`` of its last work; an edge's is the later of its
    last request's arrival and its tail's last records) and a middle collection ran
    since the last full one (so it may have moved something into the oldest generation); until
    cancelled, looking every ``every_s``.

    Python runs a full collection once ten middle ones have run, whatever the process is doing
    then: in an edge, inside a burst of events that a thousand streams wait on (26–32 ms of one
    burst in five, ``docs/benchmarks.md``, issue 14, forty-third pass). Run while nothing waits,
    it walks the same objects (what survived since the last full collection: ``FullCollections``
    freezes what survives each) and leaves the next one ten middle collections away. A process
    that is never idle collects as before."""
    while True:
        await asyncio.sleep(every_s)
        if (gc.isenabled() and counts()[2] > 0
                and time.monotonic() - busy_at() >= idle_s):
            collect()
