"""Assistant conversations before the edge's history window (decision 0011, as for a
participant's): their records are read on demand, applied before the ones the tail held, each
once and in order; an unused one is evicted and read again; an id with no conversation is read
once; without a cold reader nothing changes. Their ids carry their time (version 7 UUIDs)."""

from __future__ import annotations

import asyncio
import time
import uuid

from api.assistant.views import AssistantConversations
from api.frame.cold import ColdReadFailed
from schemas.assistant import (
    AssistantConversationErased,
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    DisplayPayload,
)
from schemas.base import Record, Sealed
from streams.envelope import Envelope
from streams.ids import (
    CLOCK_SLACK_MS,
    conversation_since_ms,
    new_assistant_conversation_id,
    workflow_since_ms,
)
from tests.unit.test_edge_cold import Reader

CONV = new_assistant_conversation_id(now=1_800_000_000.0)
SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")


def log(n_turns: int) -> list[Envelope]:
    """A chat's log: started, then turns of requested, two display events, ended."""
    records: list[Record] = [AssistantConversationStarted(conversation=CONV, owner="alice")]
    display = 0
    for t in range(n_turns):
        turn = f"{CONV}:turn-{len(records) + 1}"
        records.append(AssistantTurnRequested(conversation=CONV, turn=turn, message_id=f"m{t}",
                                              request=SEALED, after=display,
                                              at="2026-01-01T00:00:00+00:00"))
        for kind in ("text", "done"):
            display += 1
            records.append(AssistantDisplayRecorded(
                conversation=CONV, turn=turn, display_seq=display,
                event=DisplayPayload(event_id=f"e{display}", type=kind, channel="chat",
                                     message_id=turn, ts=1.0, data=SEALED)))
        records.append(AssistantTurnEnded(conversation=CONV, turn=turn, state="Replied"))
    return [Envelope(record=r, key=CONV, source="/voice/assistant", seq=i, tenant="t1")
            for i, r in enumerate(records, start=1)]


def test_a_new_chat_id_is_a_version_7_uuid_whose_time_starts_its_reads() -> None:
    made = uuid.UUID(CONV)
    assert made.version == 7 and str(made) == CONV
    assert conversation_since_ms(CONV) == 1_800_000_000_000 - CLOCK_SLACK_MS
    now = new_assistant_conversation_id()
    assert abs(conversation_since_ms(now) + CLOCK_SLACK_MS - time.time() * 1000) < 5_000
    assert now != new_assistant_conversation_id()
    # Its turns' workflows are found from the same time; an older (random) id has none.
    assert workflow_since_ms(f"{CONV}:turn-2") == conversation_since_ms(CONV)
    assert workflow_since_ms(f"{CONV}:turn-2:extract") == conversation_since_ms(CONV)
    assert conversation_since_ms(str(uuid.uuid4())) is None
    assert conversation_since_ms(CONV.upper()) is None  # not as the edge writes it


def test_records_the_tail_brings_during_the_read_apply_after_it_each_once_in_order() -> None:
    full = log(3)  # seqs 1..13, display seqs 1..6
    reader = Reader(full[:7])  # the partition ended at seq 7 when the read began …
    reader.gate.clear()
    views = AssistantConversations(cold=reader)
    views.apply(full[3])
    assert CONV not in views and not views.pending  # not asked for: dropped

    async def main() -> None:
        asker = asyncio.create_task(views.ensure(CONV))
        await asyncio.sleep(0.05)
        for env in full[5:]:  # … and the tail brings seqs 6..13 while it runs
            views.apply(env)
        assert CONV not in views and len(views.pending[CONV]) == 8
        reader.gate.set()
        await asyncio.wait_for(asker, 5)

    asyncio.run(main())
    view = views[CONV]
    assert reader.calls == 1 and CONV not in views.pending
    assert [e.display_seq for e in view.events_after(0)] == [1, 2, 3, 4, 5, 6]
    assert view.owner == "alice" and view.tenant == "t1" and view.last_seq == 13
    assert [t.state for t in view.turns.values()] == ["Replied"] * 3 and view.running is None
    asyncio.run(views.ensure(CONV))  # known now: nothing is read again
    assert reader.calls == 1


def test_an_unused_chat_is_evicted_and_read_again_and_a_stream_keeps_it() -> None:
    full = log(2)
    reader = Reader(full)
    views = AssistantConversations(cold=reader)
    asyncio.run(views.ensure(CONV))
    used = views[CONV].used_at
    assert views.evict_idle(60, now=used + 30) == 0  # used within the window: kept
    with views.streaming(CONV):  # an open stream keeps it, however long
        assert views.evict_idle(60, now=used + 3600) == 0
    assert views.evict_idle(60, now=time.monotonic() + 61) == 1 and CONV not in views
    views.apply(full[-1])
    assert CONV not in views and not views.pending  # not in memory: dropped
    asyncio.run(views.ensure(CONV))
    assert reader.calls == 2 and views[CONV].last_seq == 9


def test_an_erased_chat_read_from_the_log_keeps_its_identity_only() -> None:
    full = log(1)
    erased = Envelope(record=AssistantConversationErased(conversation=CONV), key=CONV,
                      source="/voice/assistant", seq=len(full) + 1, tenant="t1")
    views = AssistantConversations(cold=Reader([*full, erased]))
    asyncio.run(views.ensure(CONV))
    view = views[CONV]
    assert view.erased and not view.events and not view.turns
    assert not view.owned_by("alice")


def test_an_id_with_no_chat_is_read_once_and_without_a_reader_nothing_is_evicted() -> None:
    reader = Reader([])
    views = AssistantConversations(cold=reader)
    views.apply(log(1)[2])  # a stray record of that id
    asyncio.run(views.ensure(CONV))
    asyncio.run(views.ensure(CONV))
    assert reader.calls == 1 and CONV not in views and CONV not in views.pending
    full_edge = AssistantConversations()
    for env in log(1):
        full_edge.apply(env)
    assert asyncio.run(full_edge.ensure(CONV))
    assert full_edge.evict_idle(0, now=time.monotonic() + 10) == 0 and CONV in full_edge


class GapReader:
    """A gap reader over a fixed list of records (as ``api.frame.cold.gap_reader``: the
    records at display seqs in the range, and whatever else of the key a scan meets)."""

    def __init__(self, records: list[Envelope]) -> None:
        self.records, self.calls = records, 0

    def __call__(self, key: str, after: int, upto: int, since_ms: int | None = None
                 ) -> list[Envelope]:
        self.calls += 1
        return [e for e in self.records if e.key == key]


def test_an_old_cursor_is_served_from_the_log_each_display_seq_once_in_order() -> None:
    full = log(3)  # display seqs 1..6
    redelivered = [*full[:6], full[3], *full[6:]]  # a display record twice on the log
    gap = GapReader(redelivered)
    views = AssistantConversations(kept=2, gap=gap)
    for env in full:
        views.apply(env)
    view = views[CONV]
    assert view.oldest_cursor() == 4  # keeps display seqs 5 and 6

    async def main() -> None:
        found = await views.older(CONV, 0, 4)
        assert [e.record.display_seq for e in found] == [1, 2, 3, 4]
        # A narrower range of the same end is the same read, shared (one scan).
        assert [e.record.display_seq for e in await views.older(CONV, 2, 4)] == [3, 4]

    asyncio.run(main())
    assert gap.calls == 1


def test_a_display_seq_the_log_no_longer_holds_fails_the_read_never_a_hole() -> None:
    full = log(2)
    views = AssistantConversations(kept=2, gap=GapReader([e for e in full if not (
        isinstance(e.record, AssistantDisplayRecorded) and e.record.display_seq == 2)]))
    for env in full:
        views.apply(env)
    try:
        asyncio.run(views.older(CONV, 0, 2))
    except ColdReadFailed as exc:
        assert "no longer holds display seq 2" in str(exc)
    else:
        raise AssertionError("a read with a hole was served")
    assert asyncio.run(AssistantConversations(gap=None).ensure(CONV))  # nothing to load
