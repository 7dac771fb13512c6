"""A worker fetches only the changelog partitions it reads: its standbys, and its own tables'
while it recovers them.

Faust pauses a partition in its own books only (``Consumer._paused_partitions``, which its
``getmany`` filters by): the aiokafka consumer under it goes on fetching every partition
assigned. After recovery Faust pauses the changelog partitions of the tables this worker owns
(it writes them; it reads them only to recover), yet each fetch still named them, and a turn
is ~10 fetches: on the bench stack 43 of the 73 partitions of every fetch were such
changelogs (7 tables × 6 partitions), each encoded by aiokafka in Python, answered by the
broker, and decoded again (docs/benchmarks.md, "Issue 14, fifth pass"). A changelog partition
with records held its fetched batch in aiokafka's buffer for good instead.

``fetch_only_read_changelogs`` makes aiokafka's paused set follow Faust's for changelog
partitions: after each of Faust's ``pause_partitions`` / ``resume_partitions`` it pauses, on
the consumer's own thread, the assigned changelog partitions Faust holds paused and resumes
those it no longer does. The streams' partitions are left as they are (Faust pauses them
around a rebalance and relies on what aiokafka fetched meanwhile), and so are standbys, which
recovery resumes and never pauses again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

log = logging.getLogger(__name__)


def changelogs_to_pause(assigned: Collection[Any], paused_by_faust: Collection[Any],
                        paused_now: Collection[Any], changelogs: Collection[str]
                        ) -> tuple[set[Any], set[Any]]:
    """(to pause, to resume) in aiokafka so that its paused changelog partitions are exactly
    the assigned ones Faust holds paused; other topics' partitions are never named."""
    want = {tp for tp in assigned if tp.topic in changelogs and tp in paused_by_faust}
    have = {tp for tp in paused_now if tp.topic in changelogs}
    return want - have, {tp for tp in have - want if tp in assigned}


def fetch_only_read_changelogs(consumer: Any, changelogs: Callable[[], Collection[str]]) -> None:
    """Install on Faust's ``consumer`` (a thread-delegating aiokafka consumer) before it starts:
    its ``pause_partitions`` and ``resume_partitions`` then also pause and resume the changelog
    partitions in aiokafka (module docstring)."""
    pause, resume = consumer.pause_partitions, consumer.resume_partitions

    def follow() -> None:
        thread = getattr(consumer, "_thread", None)
        loop = getattr(thread, "thread_loop", None)
        if thread is None or loop is None or getattr(thread, "_consumer", None) is None:
            return  # not started: nothing is fetched yet, the first rebalance calls again
        try:
            loop.call_soon_threadsafe(apply, thread)
        except RuntimeError:  # its loop is closed (the worker is stopping): nothing fetches
            pass

    def apply(thread: Any) -> None:
        """On the consumer's thread: the state Faust holds now, whatever came in between."""
        kafka = thread._consumer
        if kafka is None:
            return
        try:
            assigned = kafka.assignment()
            to_pause, to_resume = changelogs_to_pause(
                assigned, set(consumer._paused_partitions), kafka.paused(), changelogs())
            if to_pause:
                kafka.pause(*to_pause)
            if to_resume:
                kafka.resume(*to_resume)
        except Exception:  # a rebalance took them meanwhile: the next call sets them again
            log.warning("following Faust's paused changelog partitions failed", exc_info=True)

    def pause_partitions(tps: Any) -> None:
        pause(tps)
        follow()

    def resume_partitions(tps: Any) -> None:
        resume(tps)
        follow()

    consumer.pause_partitions = pause_partitions
    consumer.resume_partitions = resume_partitions
