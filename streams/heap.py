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
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Freeze what the process holds now out of every later collection. Call once, when the
    process is built (what is frozen is never collected, so not before)."""
    gc.collect()
    gc.freeze()
