"""A record fetched before a rebalance and handed over after it (issue 12, fault 4).

Drives Faust's own fetch loop (``Consumer._drain_messages``) on a real, unstarted consumer,
with a scripted ``getmany``: the loop holds record 859 of generation 1 while the partition is
sought back to its committed offset 854 in generation 2, then fetches 854..860 again. Without
the guard, 854..858 are dropped (below the read offset the stale record left) and the
partition's commit can never pass 854.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from faust.types import TP
from faust.types.tuples import ConsumerMessage

from consumers.frame.commit_floor import CommitFloor
from consumers.frame.handover import VoiceApp
from consumers.frame.stale_records import ReadOffsets, guard_stale_records

TOPIC = "t.voice.conversations"
CHANGELOG = "t.voice-table-changelog"
TP0 = TP(TOPIC, 0)


def message(offset: int, generation: int, topic: str = TOPIC) -> ConsumerMessage:
    return ConsumerMessage(topic, 0, offset, 0.0, 0, [], b"k", b"v", None, 1, 1, TP(topic, 0),
                           generation_id=generation)


def run_fetch_loop(guarded: bool, batches: list[list[ConsumerMessage]],
                   changelogs: frozenset[str] = frozenset()) -> tuple[list[int], Any]:
    """Faust's fetch loop over ``batches``: generation 1 is the first batch's, the rest are
    generation 2, each after a seek to 854. Returns the offsets handed over."""
    app = VoiceApp("stale-records-test", broker="kafka://127.0.0.1:1", store="memory://",
                   web_enabled=False)
    consumer = app.consumer
    assert isinstance(consumer._read_offset, ReadOffsets), "VoiceApp installs the guard"
    handed: list[int] = []

    async def deliver(msg: ConsumerMessage) -> None:
        handed.append(msg.offset)

    consumer.callback = deliver
    if guarded:
        guard_stale_records(consumer, lambda: app.consumer_generation_id, lambda: changelogs)
    else:
        from collections import defaultdict
        consumer._read_offset = defaultdict(lambda: None)
    fetcher = type("Fetcher", (), {})()
    fetcher._stopped = asyncio.Event()

    async def getmany(timeout: float) -> AsyncIterator[tuple[TP, ConsumerMessage]]:  # noqa: ARG001
        if not batches:
            fetcher._stopped.set()
            return
        batch = batches.pop(0)
        for msg in batch:
            yield msg.tp, msg
            # after the first record handed over: the rebalance (generation 2, sought back)
            if app.consumer_generation_id == 1:
                app.consumer_generation_id = 2
                consumer._read_offset.update({TP0: 854})

    consumer.getmany = getmany
    consumer._commit_every = None
    app.consumer_generation_id = 1

    async def main() -> None:
        await asyncio.wait_for(consumer._drain_messages(fetcher), timeout=30)

    # Faust's services schedule on their own loop (``wait_first``): run the loop there.
    consumer.loop.run_until_complete(main())
    return handed, consumer


def test_a_record_of_the_old_generation_does_not_drop_the_records_read_again() -> None:
    """The regression: unguarded, Faust hands over the stale 859 (the stream would skip it)
    and then drops 854..858, read again after the seek — they are never handled; guarded,
    859 is held back and 854..860 are all handed over, in order."""
    again = [message(o, 2) for o in range(854, 861)]

    handed, _ = run_fetch_loop(False, [[message(858, 1), message(859, 1)], list(again)])
    assert handed == [858, 859, 859, 860], "Faust alone drops 854..858 (the bug)"

    handed, consumer = run_fetch_loop(True, [[message(858, 1), message(859, 1)], list(again)])
    assert handed == [858, 854, 855, 856, 857, 858, 859, 860]
    assert consumer._read_offset[TP0] == 860


def test_a_changelog_record_is_handed_over_whatever_its_generation() -> None:
    """Table recovery reads the changelogs and seeks them itself: the guard leaves them be."""
    log_tp = TP(CHANGELOG, 0)
    handed, consumer = run_fetch_loop(
        True, [[message(5, 1, CHANGELOG), message(6, 1, CHANGELOG)]], frozenset({CHANGELOG}))
    assert handed == [5, 6]
    assert consumer._read_offset[log_tp] == 6


def test_only_the_update_after_the_stale_record_is_ignored() -> None:
    offsets = ReadOffsets({TP0: 854})
    offsets.stale(TP0, 859)
    offsets[TP0] = 859
    assert offsets[TP0] == 854
    offsets[TP0] = 859
    assert offsets[TP0] == 859
    assert offsets[TP(TOPIC, 1)] is None


def test_a_commit_stuck_behind_records_never_handled_is_found() -> None:
    """What ``VoiceApp.reread_holes`` reads again (fault 4, seen with Faust's commit at 279
    and ``acked`` from 282, nothing unacknowledged): not a record being handled, not a gap
    Faust skips, not a changelog, not the off-by-one Faust commits past anyway."""
    from intervaltree import IntervalTree

    from consumers.frame.handover import holes

    a, b, cl = TP(TOPIC, 1), TP(TOPIC, 2), TP(CHANGELOG, 1)
    committed = {a: 279, b: 279, cl: 5}
    acked = {a: [282, 283], b: [280, 281], cl: [9]}
    # b: 279 is the next offset to read, and it is not acknowledged (Faust's own commit let
    # one such record go by: ``consumers.frame.commit_floor``)
    assert holes({a, b, cl}, {CHANGELOG}, committed, acked, {}, {}) == {a: (279, 282),
                                                                       b: (279, 280)}
    assert holes({b}, set(), committed, {b: [279, 280]}, {}, {}) == {}
    assert holes({a}, set(), committed, acked, {}, {a: {280}}) == {}, "being handled"
    assert holes({a}, set(), committed, acked, {}, {a: {300}}) == {a: (279, 282)}
    gap = IntervalTree()
    gap.addi(279, 282)
    assert holes({a}, set(), committed, acked, {a: gap}, {}) == {}, "a gap Faust skips"
    assert holes({a}, set(), {a: None}, acked, {}, {}) == {}
    assert holes({a}, set(), committed, {a: []}, {}, {}) == {}


def guarded_gapless(consumer: Any, app: Any, deliver: Any, committed: int | None,
                    raw_seek: Any) -> None:
    """``consumer`` (of ``app``, generation 1) holding ``TP0`` of a gapless topic whose
    committed offset is ``committed``, seeking with ``raw_seek``, handing over to ``deliver``,
    with the guard installed."""

    async def seek_to_committed() -> dict[TP, int | None]:
        return {TP0: committed}

    consumer.callback = deliver
    consumer.seek_to_committed = seek_to_committed
    consumer._seek = raw_seek
    consumer.assignment = lambda: {TP0}
    app.consumer_generation_id = 1
    guard_stale_records(consumer, lambda: app.consumer_generation_id, lambda: frozenset(),
                        lambda topic: topic == TOPIC)


def run_gapless_loop(committed: int | None, batches: list[list[int]], refetch: list[int],
                     start: int | None = None, early: list[int] | None = None
                     ) -> tuple[list[int], list[int], Any]:
    """Faust's fetch loop on a gapless topic whose committed offset is ``committed`` (set by
    ``perform_seek``, as after an assignment): ``batches`` of offsets are fetched in order;
    a seek (the guard's) makes the next fetch ``refetch``. ``start``: the partition's first
    offset, with ``CommitFloor`` installed too. ``early``: offsets fetched in the generation
    before its seek has finished (the partition resumed first). Returns the offsets handed
    over, the offsets sought to, and the consumer."""
    import faust

    app = faust.App("gapless-test", broker="kafka://127.0.0.1:1", store="memory://",
                    web_enabled=False)
    consumer = app.consumer
    handed: list[int] = []
    sought: list[int] = []

    async def deliver(msg: ConsumerMessage) -> None:
        handed.append(msg.offset)

    async def raw_seek(tp: TP, offset: int) -> None:  # noqa: ARG001
        sought.append(offset)
        pending.insert(0, list(refetch))

    guarded_gapless(consumer, app, deliver, committed, raw_seek)
    if start is not None:
        async def earliest_offsets(*tps: TP) -> dict[TP, int]:
            return {tp: start for tp in tps}

        consumer.earliest_offsets = earliest_offsets
        CommitFloor(consumer, lambda: frozenset(), lambda topic: topic == TOPIC)
    pending = [list(b) for b in batches]
    fetcher = type("Fetcher", (), {})()
    fetcher._stopped = asyncio.Event()

    async def getmany(timeout: float) -> AsyncIterator[tuple[TP, ConsumerMessage]]:  # noqa: ARG001
        if not pending:
            fetcher._stopped.set()
            return
        for offset in pending.pop(0):
            yield TP0, message(offset, 1)

    consumer.getmany = getmany
    consumer._commit_every = None

    async def main() -> None:
        if early:
            await fetch_before_the_seek(consumer, early, handed)
        await consumer.perform_seek()
        await asyncio.wait_for(consumer._drain_messages(fetcher), timeout=30)

    consumer.loop.run_until_complete(main())
    return handed, sought, consumer


async def fetch_before_the_seek(consumer: Any, offsets: list[int], handed: list[int]) -> None:
    """Faust's fetch loop over ``offsets`` of generation 1 before its seek has run."""
    fetcher = type("Fetcher", (), {})()
    fetcher._stopped = asyncio.Event()
    getmany = consumer.getmany

    async def once(timeout: float) -> AsyncIterator[tuple[TP, ConsumerMessage]]:  # noqa: ARG001
        fetcher._stopped.set()
        for offset in offsets:
            yield TP0, message(offset, 1)

    consumer.getmany = once
    await asyncio.wait_for(consumer._drain_messages(fetcher), timeout=30)
    consumer.getmany = getmany


def test_records_faust_would_skip_as_a_gap_are_read_again_and_handed_over() -> None:
    """The regression (fault 4, a turn that never started): the fetch jumped from 152 to 155.
    Faust alone registers 153..154 as a gap — acknowledged, committed past, never handled.
    Guarded, 155 and 156 are held back, the partition is sought back to 153, and 153..156 are
    handed over in order; no gap is registered."""
    handed, sought, consumer = run_gapless_loop(152, [[152, 155, 156]], [153, 154, 155, 156])
    assert handed == [152, 153, 154, 155, 156]
    assert sought == [153]
    assert not consumer._gap.get(TP0)


def test_the_committed_record_is_handed_over_before_the_next() -> None:
    """Faust's off-by-one: after the seek to the committed 152 a fetch starting at 153 is
    taken (Faust would commit past 152 without handling it); the guard reads 152 first."""
    handed, sought, _ = run_gapless_loop(152, [[153, 154]], [152, 153, 154])
    assert handed == [152, 153, 154]
    assert sought == [152]


def test_a_topic_with_gaps_of_its_own_is_left_to_faust() -> None:
    """A compacted topic has gaps: Faust registers them, nothing is sought back."""
    import faust

    app = faust.App("gapless-test-2", broker="kafka://127.0.0.1:1", store="memory://",
                    web_enabled=False)
    consumer = app.consumer
    added: list[tuple[int, int]] = []

    async def add_gap(tp: TP, a: int, b: int) -> None:  # noqa: ARG001
        added.append((a, b))

    consumer._add_gap = add_gap
    guard_stale_records(consumer, lambda: 1, lambda: frozenset(), lambda topic: False)
    consumer.loop.run_until_complete(consumer._add_gap(TP0, 153, 155))
    assert added == [(153, 155)]



def test_a_record_fetched_before_its_generations_seek_waits_for_it() -> None:
    """The regression (a second worker joined; a conversation's ``SendMessage`` at 4 was
    decided before its ``StartConversation`` at 3, refused, and 3 then skipped): Faust resumed
    the partition before its seek to the committed 3 had finished, and 4 came first. Guarded,
    4 is held back (and its read offset not moved) until the seek, then 3 and 4 come in
    order."""
    handed, sought, _ = run_gapless_loop(3, [[3, 4]], [], early=[4])
    assert handed == [3, 4]
    assert sought == [3], "sought again once the seek was done"


def test_records_held_back_after_the_seek_moved_the_partition_are_read_again() -> None:
    """The race in the fix above (seen as a killed worker's turn never resumed): the seek had
    already moved aiokafka to the committed 15 when 15 and 16 were fetched and handed over,
    before the seek was done (it still waited on the broker) — held back, and no fetch would
    bring them again. Once the seek is done the partition is sought to 15 once more."""
    handed, sought, _ = run_gapless_loop(15, [], [15, 16], early=[15, 16])
    assert handed == [15, 16]
    assert sought == [15]


def test_a_partition_never_committed_is_read_again_from_its_start() -> None:
    """The regression (a second worker joined; a turn's ``WorkflowStarted``, the only record
    of its partition, was never handled): Faust dropped the fetch that held offset 0 while it
    held the partition paused, and with nothing committed its seek left aiokafka at 1.
    With ``CommitFloor`` the seek goes to the partition's first offset (before any fetch:
    aiokafka's position 1 is replaced) and 0 is handed over first."""
    handed, sought, _ = run_gapless_loop(None, [], [0, 1, 2], start=0)
    assert handed == [0, 1, 2]
    assert sought == [0]


def test_without_it_a_partition_never_committed_loses_what_faust_dropped() -> None:
    """What the seek to the start mends: Faust's own seek leaves a partition with no commit
    where it was, so offset 0 is never handed over."""
    handed, sought, _ = run_gapless_loop(None, [[1, 2]], [0, 1, 2])
    assert handed == [1, 2]
    assert sought == []


def test_with_no_offset_named_the_lowest_record_held_back_is_read_again() -> None:
    handed, sought, _ = run_gapless_loop(None, [], [5, 6], early=[6, 5])
    assert handed == [5, 6]
    assert sought == [5]


def test_a_partition_taken_away_before_the_seek_again_does_not_fail_the_seek() -> None:
    """A rebalance can take the partition between the seek and the seek again (aiokafka
    refuses to seek a partition not assigned): logged, and the seek itself succeeds."""
    import faust

    app = faust.App("gapless-test-3", broker="kafka://127.0.0.1:1", store="memory://",
                    web_enabled=False)
    consumer = app.consumer

    async def raw_seek(tp: TP, offset: int) -> None:  # noqa: ARG001
        raise RuntimeError("not assigned")

    async def deliver(msg: ConsumerMessage) -> None:
        raise AssertionError("held back: never handed over")

    guarded_gapless(consumer, app, deliver, 15, raw_seek)
    consumer.loop.run_until_complete(consumer.callback(message(15, 1)))
    consumer.loop.run_until_complete(consumer.perform_seek())


def test_a_takeover_logs_where_it_reads_from(caplog: Any) -> None:
    """For a takeover's post-mortem (a worker-kill fault test's report carries its log): at
    ``info``, the generation's seek names each committed offset and each record held back
    before it, and each partition's first hand-over names its offset."""
    import logging

    with caplog.at_level(logging.INFO, logger="consumers.frame.stale_records"):
        handed, _, _ = run_gapless_loop(3, [], [3, 4], early=[4])
    assert handed == [3, 4]
    lines = [r.getMessage() for r in caplog.records]
    assert (f"generation 1: sought to {TOPIC}[0]@3 (each partition's committed offset, or "
            f"its first if never committed); held back before it: {TOPIC}[0]@4") in lines
    assert f"generation 1: {TOPIC}[0] first hands over offset 3" in lines
    assert not any("first hands over offset 4" in line for line in lines), "once a generation"
