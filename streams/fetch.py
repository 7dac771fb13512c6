"""How Voice's own consumers fetch: the one setting of every consumer that follows a topic's
end (the edge's tail, the followers, the key store, the log reader).

``fetch.wait.max.ms`` is how long the broker may hold a fetch that finds nothing new. It is
not a latency: with ``fetch.min.bytes`` at 1 a record appended to any partition of the fetch
ends the wait at once. It only sets how often an idle consumer asks again — and each fetch
names every partition the consumer reads, so at 5 ms (the edge's tail) or 50 ms (followers, key
stores) the broker spent much of its CPU answering "nothing new", more the more partitions
(``docs/benchmarks.md``, "Writer, POST path and fetch settings"). It must never hold anything
that changes what a consumer reads.
"""

from __future__ import annotations

IDLE_FETCH_WAIT_MS = 500
"""The broker holds a fetch with nothing new at most this long (librdkafka's default)."""

TAILING: dict[str, object] = {
    "fetch.wait.max.ms": IDLE_FETCH_WAIT_MS,
    "fetch.min.bytes": 1,  # any record ends the broker's wait: no latency from the above
}
"""The fetch settings of a consumer that follows a topic's end."""
