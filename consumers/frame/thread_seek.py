"""A seek runs on the consumer's own thread, never beside its fetch.

Faust's aiokafka driver runs the aiokafka consumer on a thread of its own (its fetches, its
commits, its group coordination), but its ``seek`` calls aiokafka's ``seek`` straight from the
worker's event loop. aiokafka is not thread-safe: its ``Fetcher.fetched_records`` walks a
snapshot of its fetched batches and deletes each one it drains, while ``seek`` deletes the
sought partition's batch; when the two interleave the fetch raises ``KeyError`` into Faust's
fetch loop, and Faust stops the whole worker (seen in a full CI run: in ``test_staff_review``
the worker left to take over a killed one's partitions stopped so, and the publish step was
never resumed).

``seek_on_consumer_thread`` makes Faust's consumer hand every seek to that thread, the way
Faust already runs ``seek_to_committed`` and its commits there.
"""

from __future__ import annotations

from typing import Any


def seek_on_consumer_thread(consumer: Any) -> None:
    """Install on Faust's thread-delegating consumer before it starts: its ``seek`` (and
    everything built on it) then runs aiokafka's seek on the consumer's thread."""

    async def _seek(tp: Any, offset: int) -> None:
        thread = consumer._thread
        await thread.call_thread(thread.seek, tp, offset)

    consumer._seek = _seek
