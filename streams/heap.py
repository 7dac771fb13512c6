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
(~170 objects each) and the events its views keep (~4 each). ``settle_heap`` also starts
``FullCollections``, which logs every full collection that stops the process for
``LONG_PAUSE_MS`` or more, with what it walked — the pause every request and stream of that
process waited out (docs/benchmarks.md, "Issue 14, fifteenth pass").
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

LONG_PAUSE_MS = 50.0
"""A full collection at least this long is logged (a warning)."""


class FullCollections:
    """A ``gc.callbacks`` entry timing the process's full (oldest generation) collections:
    how many, their total and longest time; one of ``over_ms`` or more is logged with the
    objects the oldest generation holds after it."""

    def __init__(self, over_ms: float = LONG_PAUSE_MS,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.over_ms = over_ms
        self._clock = clock
        self._started: float | None = None
        self.count = 0
        self.total_ms = 0.0
        self.longest_ms = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = self._clock()
            return
        if self._started is None:  # installed during a collection
            return
        ms = (self._clock() - self._started) * 1000
        self._started = None
        self.count += 1
        self.total_ms += ms
        self.longest_ms = max(self.longest_ms, ms)
        if ms >= self.over_ms:
            log.warning("a full garbage collection stopped this process for %.0f ms: it walked "
                        "%d objects made since start (every request and stream of it waited)",
                        ms, len(gc.get_objects(2)))


WATCH = FullCollections()
"""This process's watch (``settle_heap`` starts it)."""


def settle_heap() -> None:
    """Freeze what the process holds now out of every later collection, and time the later
    full collections (``WATCH``). Call once, when the process is built (what is frozen is
    never collected, so not before)."""
    gc.collect()
    gc.freeze()
    if WATCH not in gc.callbacks:
        gc.callbacks.append(WATCH)
