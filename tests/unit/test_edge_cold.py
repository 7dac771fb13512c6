"""Conversations started before the edge's history window (decision 0011): their records are
read on demand, applied before the ones the tail held, each once and in seq order; an id with
no conversation is read once; without a cold reader nothing changes."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest

from api.conversations.views import ConversationViews
from api.frame.cold import ColdReadFailed
from schemas.base import Record, Sealed
from schemas.conversation import (
    ConversationStarted,
    MessageRecorded,
    TurnRequested,
    TurnStateChanged,
)
from streams.envelope import Envelope

CNV = "cnv-00000000000000aa"
SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")


def log(n_turns: int) -> list[Envelope]:
    """A conversation's log: started, then turns of message, requested, thinking, replied."""
    records: list[Record] = [ConversationStarted(conversation=CNV, owner="alice")]
    for t in range(n_turns):
        msg_seq = 2 + 4 * t
        turn = f"{CNV}:turn-{msg_seq}"
        records += [MessageRecorded(conversation=CNV, message_id=f"m{t}", text=SEALED,
                                    at="2026-01-01T00:00:00+00:00"),
                    TurnRequested(conversation=CNV, turn=turn, message_seq=msg_seq),
                    TurnStateChanged(conversation=CNV, turn=turn, state="Thinking"),
                    TurnStateChanged(conversation=CNV, turn=turn, state="Replied")]
    return [Envelope(record=r, key=CNV, source="/voice/sequencer", seq=i, tenant="t1")
            for i, r in enumerate(records, start=1)]


class Reader:
    """A cold reader over a fixed list of records; counts its calls; can be held."""

    def __init__(self, records: list[Envelope], fail: bool = False) -> None:
        self.records, self.fail = records, fail
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, key: str) -> list[Envelope]:
        self.calls += 1
        self.gate.wait(10)
        if self.fail:
            raise ColdReadFailed("held")
        return [e for e in self.records if e.key == key]


def test_records_the_tail_brings_during_the_read_apply_after_it_each_once_in_order() -> None:
    full = log(3)  # seqs 1..13
    reader = Reader(full[:8])  # the partition ended at seq 8 when the read began …
    reader.gate.clear()
    views = ConversationViews(cold=reader)
    assert views.apply(full[3]) is None and not views.pending  # not asked for: dropped

    async def main() -> None:
        asker = asyncio.create_task(views.ensure(CNV))
        await asyncio.sleep(0.05)
        for env in full[6:]:  # … and the tail brings seqs 7..13 while it runs
            assert views.apply(env) is None  # held, not a view yet
        assert CNV not in views and len(views.pending[CNV]) == 7
        reader.gate.set()
        await asyncio.wait_for(asker, 5)

    asyncio.run(main())
    view = views[CNV]
    assert reader.calls == 1 and CNV not in views.pending
    assert [e.seq for e in view.events_after(0)] == list(range(1, 14))
    assert view.owner == "alice" and view.tenant == "t1" and view.first_seen == 1
    assert [t.state for t in view.turns.values()] == ["Replied"] * 3
    asyncio.run(views.ensure(CNV))  # known now: nothing is read again
    assert reader.calls == 1


def test_an_unused_view_is_evicted_and_read_again_when_asked_for() -> None:
    full = log(2)
    reader = Reader(full)
    views = ConversationViews(cold=reader)
    asyncio.run(views.ensure(CNV))
    used = views[CNV].used_at
    assert views.evict_idle(60, now=used + 30) == 0  # used within the window: kept
    with views.streaming(CNV):  # an open stream keeps it, however long
        assert views.evict_idle(60, now=used + 3600) == 0
    assert views.evict_idle(60, now=time.monotonic() + 61) == 1 and CNV not in views
    assert views.apply(full[-1]) is None and not views.pending  # not in memory: dropped
    asyncio.run(views.ensure(CNV))
    assert reader.calls == 2
    assert [e.seq for e in views[CNV].events_after(0)] == list(range(1, 10))


def test_an_id_asked_for_before_its_conversation_started_is_read_again_once_evicted() -> None:
    """Regression: an id a read found nothing of was remembered as absent for good, so once
    its conversation started (the tail brought it) and its view was evicted, asking for it
    again read nothing — a 404 for a conversation the log holds."""
    full = log(1)
    reader = Reader([])  # asked for before its first record reached the log
    views = ConversationViews(cold=reader)

    async def main() -> None:
        assert await views.ensure(CNV) is True and CNV not in views
        await asyncio.sleep(0)  # the read's end is noted
        for env in full:  # then it starts: the tail brings it
            views.apply(env)
        assert CNV in views
        reader.records = full
        assert views.evict_idle(60, now=time.monotonic() + 61) == 1 and CNV not in views
        assert await views.ensure(CNV) is True

    asyncio.run(main())
    assert reader.calls == 2
    assert [e.seq for e in views[CNV].events_after(0)] == list(range(1, 6))


def test_a_waiter_keeps_a_view_and_an_edge_without_a_cold_reader_evicts_nothing() -> None:
    views = ConversationViews(cold=Reader(log(1)))
    asyncio.run(views.ensure(CNV))

    async def main() -> None:
        waiter = asyncio.create_task(views.wait(CNV, lambda v: False, 5))
        await asyncio.sleep(0.01)
        assert views.evict_idle(0, now=time.monotonic() + 10) == 0
        waiter.cancel()

    asyncio.run(main())
    full_edge = ConversationViews()
    for env in log(1):
        full_edge.apply(env)
    assert full_edge.evict_idle(0, now=time.monotonic() + 10) == 0 and CNV in full_edge


def test_a_record_after_the_load_applies_as_usual() -> None:
    full = log(2)
    views = ConversationViews(cold=Reader(full[:5]))
    asyncio.run(views.ensure(CNV))
    assert views[CNV].last_seq == 5
    assert views.apply(full[5]) is views[CNV]
    assert views.apply(full[5]) is None  # a redelivery still changes nothing
    assert views[CNV].last_seq == 6


def test_an_id_with_no_conversation_is_read_once_and_its_orphans_dropped() -> None:
    reader = Reader([])
    views = ConversationViews(cold=reader)
    views.apply(log(1)[2])  # a stray record of that id
    asyncio.run(views.ensure(CNV))
    asyncio.run(views.ensure(CNV))
    assert reader.calls == 1 and CNV not in views and CNV not in views.pending
    assert views.apply(log(1)[3]) is None and CNV not in views.pending  # not held any more


def test_concurrent_askers_share_one_read() -> None:
    reader = Reader(log(1))
    reader.gate.clear()
    views = ConversationViews(cold=reader)

    async def main() -> None:
        askers = [asyncio.create_task(views.ensure(CNV)) for _ in range(5)]
        await asyncio.sleep(0.05)
        reader.gate.set()
        await asyncio.gather(*askers)

    asyncio.run(main())
    assert reader.calls == 1 and views[CNV].last_seq == 5


def test_a_failed_read_is_raised_and_tried_again_later() -> None:
    reader = Reader(log(1), fail=True)
    views = ConversationViews(cold=reader)
    with pytest.raises(ColdReadFailed):
        asyncio.run(views.ensure(CNV))
    reader.fail = False
    asyncio.run(views.ensure(CNV))
    assert reader.calls == 2 and views[CNV].last_seq == 5


def test_without_a_cold_reader_nothing_is_held_or_read() -> None:
    views = ConversationViews()
    assert views.apply(log(1)[2]) is None
    asyncio.run(views.ensure(CNV))
    assert CNV not in views and not views.pending


def test_a_view_the_tail_brings_first_ends_the_wait_and_the_read_changes_nothing() -> None:
    reader = Reader([])  # the conversation is new: nothing of it before the window
    reader.gate.clear()
    views = ConversationViews(cold=reader)
    started = log(1)[0]

    async def main() -> None:
        asker = asyncio.create_task(views.ensure(CNV))
        await asyncio.sleep(0.05)
        assert not asker.done()
        views.apply(started)  # the tail applies its start meanwhile
        await asyncio.wait_for(asker, 5)  # answered without the read
        reader.gate.set()
        while views._loading:  # the read ends on its own
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert views[CNV].last_seq == 1 and CNV not in views.pending
    assert views.apply(log(1)[1]) is views[CNV]  # not taken for an absent id


def test_a_read_longer_than_the_wait_is_not_settled_and_goes_on_for_the_retry() -> None:
    reader = Reader(log(1))
    reader.gate.clear()
    views = ConversationViews(cold=reader)

    async def main() -> None:
        assert await views.ensure(CNV, timeout=0.05) is False  # the request answers 503
        reader.gate.set()
        assert await views.ensure(CNV, timeout=5) is True  # its retry: the same read
        assert reader.calls == 1

    asyncio.run(main())
    assert views[CNV].last_seq == 5


class GapReader:
    """A gap reader over a fixed list of records (seq range per key); counts its calls."""

    def __init__(self, records: list[Envelope]) -> None:
        self.records = records
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, key: str, after: int, upto: int, since_ms: int | None = None
                 ) -> list[Envelope]:
        self.calls += 1
        self.gate.wait(10)
        return [e for e in self.records
                if e.key == key and e.seq is not None and after < e.seq <= upto]


def test_events_older_than_kept_are_read_each_once_in_order_and_shared() -> None:
    full = log(3)  # seqs 1..13
    gap = GapReader([*full, full[4]])  # a redelivered record on the log too
    views = ConversationViews(kept=4, gap=gap)
    for env in full:
        views.apply(env)
    view = views.get(CNV)
    assert view is not None and view.oldest_cursor() == 9

    async def go() -> tuple[list[Envelope], list[Envelope]]:
        gap.gate.clear()
        a = asyncio.ensure_future(views.older(CNV, 2, 9))
        b = asyncio.ensure_future(views.older(CNV, 2, 9))
        await asyncio.sleep(0.05)
        gap.gate.set()
        return await a, await b

    a, b = asyncio.run(go())
    assert [e.seq for e in a] == list(range(3, 10)) and a == b
    assert gap.calls == 1
    # A later cursor within a range already read is served from it; a lower one reads again.
    assert [e.seq for e in asyncio.run(views.older(CNV, 6, 9))] == [7, 8, 9]
    assert gap.calls == 1
    assert [e.seq for e in asyncio.run(views.older(CNV, 0, 9))] == list(range(1, 10))
    assert gap.calls == 2


def test_a_hole_in_the_older_events_is_refused_never_served() -> None:
    full = log(3)
    views = ConversationViews(kept=4, gap=GapReader([e for e in full if e.seq != 5]))
    for env in full:
        views.apply(env)
    with pytest.raises(ColdReadFailed, match="no longer holds seq 5"):
        asyncio.run(views.older(CNV, 0, 9))


def test_older_records_of_another_tenant_are_refused() -> None:
    full = log(3)
    other = [dataclasses.replace(e, tenant="t2") if e.seq == 3 else e for e in full]
    views = ConversationViews(kept=4, gap=GapReader(other))
    for env in full:
        views.apply(env)
    with pytest.raises(ColdReadFailed, match="another tenant"):
        asyncio.run(views.older(CNV, 0, 9))


def test_without_a_gap_reader_older_events_are_refused() -> None:
    views = ConversationViews(kept=4)
    with pytest.raises(ColdReadFailed):
        asyncio.run(views.older(CNV, 0, 9))


def test_conversation_ids_carry_their_time() -> None:
    import re

    from streams.ids import (
        CLOCK_SLACK_MS,
        CONVERSATION_ID,
        conversation_since_ms,
        new_conversation_id,
    )

    ids = {new_conversation_id(now=1_800_000_000.123) for _ in range(100)}
    assert len(ids) == 100 and all(re.match(CONVERSATION_ID, i) for i in ids)
    for i in ids:  # the records take them
        assert ConversationStarted(conversation=i, owner="alice").conversation == i
    assert {conversation_since_ms(i) for i in ids} == {1_800_000_000_123 - CLOCK_SLACK_MS}
    assert new_conversation_id(now=4.0) < new_conversation_id(now=5.0)  # ordered by time
    for old in ("cnv-00000000000000aa", "cnv-0123456789abcdef0123456789abcdef", "cnv-12345678"):
        assert conversation_since_ms(old) is None
    assert conversation_since_ms(new_conversation_id(now=1.0)) == 0  # never negative
