"""The edge's conversation views: dedupe by seq, turn states, bounded events, erasure, waiters."""

from __future__ import annotations

import asyncio

import pytest

from api.conversations.views import ConversationViews
from api.frame.auth import Principal
from api.frame.projection import CursorTooOld
from schemas.base import Sealed
from schemas.conversation import (
    ConversationErased,
    ConversationStarted,
    MessageRecorded,
    ProposalRecorded,
    ReplyRecorded,
    TurnRequested,
    TurnStateChanged,
)
from streams.envelope import Envelope
from streams.ids import parse_turn, turn_id

CNV = "cnv-00112233aabbccdd"
SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")


def env(record, seq: int, key: str = CNV, tenant: str = "t1") -> Envelope:  # noqa: ANN001
    return Envelope(record=record, key=key, source="/test", seq=seq, tenant=tenant)


def started(seq: int = 1, owner: str = "alice", key: str = CNV, tenant: str = "t1"
            ) -> Envelope:
    return env(ConversationStarted(conversation=key, owner=owner), seq, key, tenant)


def who(sub: str, tenant: str = "t1") -> Principal:
    return Principal(sub=sub, role="participant", tenant=tenant)


def turn_records(msg_seq: int, key: str = CNV) -> list[Envelope]:
    """What the sequencer appends for one message: message, turn requested, Thinking."""
    turn = turn_id(key, msg_seq)
    return [
        env(MessageRecorded(conversation=key, message_id=f"m{msg_seq}", text=SEALED,
                            at="2025-01-01T00:00:00+00:00"), msg_seq, key),
        env(TurnRequested(conversation=key, turn=turn, message_seq=msg_seq), msg_seq + 1, key),
        env(TurnStateChanged(conversation=key, turn=turn, state="Thinking"), msg_seq + 2, key),
    ]


def test_turn_ids_round_trip() -> None:
    assert turn_id(CNV, 7) == f"{CNV}:turn-7"
    assert parse_turn(f"{CNV}:turn-7") == (CNV, 7)
    for bad in (f"{CNV}:turn-0", f"{CNV}:turn-x", f"{CNV}:turn-", CNV, ":turn-3"):
        assert parse_turn(bad) is None


def test_redelivered_records_change_nothing() -> None:
    views = ConversationViews()
    assert views.apply(started()) is not None
    assert views.apply(started()) is None  # the same start again
    for e in turn_records(2):
        assert views.apply(e) is not None
    for e in turn_records(2):  # a replayed command yields the same seqs: all ignored
        assert views.apply(e) is None
    view = views[CNV]
    assert view.last_seq == 4 and [e.seq for e in view.events] == [1, 2, 3, 4]
    assert list(view.content) == [2]


def test_records_of_unknown_conversations_and_without_seq_are_ignored() -> None:
    views = ConversationViews()
    assert views.apply(turn_records(2, key="cnv-ffffffffffffffff")[0]) is None
    views.apply(started())
    no_seq = Envelope(record=ConversationErased(conversation=CNV), key=CNV, source="/t")
    assert views.apply(no_seq) is None and not views[CNV].erased


def test_turn_state_reply_and_proposal() -> None:
    views = ConversationViews()
    views.apply(started())
    for e in turn_records(2):
        views.apply(e)
    turn = turn_id(CNV, 2)
    tv = views[CNV].turns[turn]
    assert (tv.state, tv.message_seq, tv.reply, tv.proposal) == ("Thinking", 2, None, None)
    reply = env(ReplyRecorded(conversation=CNV, turn=turn, reply_id="r", text=SEALED), 5)
    proposal = env(ProposalRecorded(conversation=CNV, turn=turn, proposal_id="p",
                                    proposal=SEALED), 6)
    done = env(TurnStateChanged(conversation=CNV, turn=turn, state="Replied"), 7)
    for e in (reply, proposal, done):
        views.apply(e)
    assert (tv.state, tv.reply, tv.proposal) == ("Replied", reply, proposal)
    assert sorted(views[CNV].content) == [2, 5, 6]
    failed = env(TurnStateChanged(conversation=CNV, turn=turn_id(CNV, 8), state="CouldNotInterpret",
                                  reason_code="could_not_interpret"), 8)
    views.apply(failed)
    other = views[CNV].turns[turn_id(CNV, 8)]
    assert (other.state, other.ended, other.message_seq) == ("CouldNotInterpret",
                                                             failed.record, 8)


def test_events_after_a_cursor_and_the_bounded_list() -> None:
    views = ConversationViews(kept=5)
    views.apply(started())
    for n in (2, 5, 8):
        for e in turn_records(n):
            views.apply(e)
    view = views[CNV]
    assert view.last_seq == 10 and [e.seq for e in view.events] == [6, 7, 8, 9, 10]
    assert view.oldest_cursor() == 5
    assert [e.seq for e in view.events_after(5)] == [6, 7, 8, 9, 10]
    assert [e.seq for e in view.events_after(8)] == [9, 10]
    assert view.events_after(10) == [] and view.events_after(99) == []
    with pytest.raises(CursorTooOld) as err:
        view.events_after(4)
    assert err.value.oldest == 5 and "5" in str(err.value)
    # Content and turns are not bounded by the event list.
    assert sorted(view.content) == [2, 5, 8] and len(view.turns) == 3


def test_a_trimmed_log_makes_the_first_seen_seq_the_oldest_cursor() -> None:
    views = ConversationViews()
    views.apply(started(seq=4))  # the first records were trimmed by retention
    view = views[CNV]
    assert view.first_seen == 4 and view.oldest_cursor() == 3
    with pytest.raises(CursorTooOld):
        view.events_after(0)
    assert [e.seq for e in view.events_after(3)] == [4]


def test_erasure_forgets_content_and_hides_the_conversation() -> None:
    views = ConversationViews()
    views.apply(started())
    views.apply(started(owner="bob", key="cnv-0000000000000002"))
    for e in turn_records(2):
        views.apply(e)
    assert views.owned(CNV, who("alice")) is not None and views.owned(CNV, who("bob")) is None
    assert [v.conversation for v in views.list_for(who("alice"))] == [CNV]
    views.apply(env(ConversationErased(conversation=CNV), 5))
    view = views[CNV]
    assert view.erased and not view.events and not view.content and not view.turns
    assert views.owned(CNV, who("alice")) is None and views.list_for(who("alice")) == []
    # A turn result that was already in flight is counted, not kept.
    late = env(ReplyRecorded(conversation=CNV, turn=turn_id(CNV, 2), reply_id="r",
                             text=SEALED), 6)
    assert views.apply(late) is view and view.last_seq == 6 and not view.content
    assert views.owned("cnv-0000000000000002", who("bob")) is not None


def test_marking_erased_locally_before_the_log_says_so() -> None:
    views = ConversationViews()
    views.apply(started())
    for e in turn_records(2):
        views.apply(e)
    views.mark_erased(CNV)
    assert views.owned(CNV, who("alice")) is None and not views[CNV].content
    views.mark_erased("cnv-ffffffffffffffff")  # unknown: nothing happens
    assert views.apply(env(ConversationErased(conversation=CNV), 5)) is not None
    assert views[CNV].erased


async def test_waiters_wake_on_a_change_and_time_out_otherwise() -> None:
    views = ConversationViews()
    assert await views.wait(CNV, lambda v: v is None, 0.01)  # holds at once
    assert not await views.wait(CNV, lambda v: v is not None, 0.05)
    assert views.waiting(CNV) == 0  # a timed-out waiter leaves nothing behind

    async def reach(seq: int) -> bool:
        return await views.wait(CNV, lambda v: v is not None and v.last_seq >= seq, 5)

    waiter = asyncio.create_task(reach(3))
    await asyncio.sleep(0)
    assert views.waiting(CNV) == 1
    views.apply(started())
    await asyncio.sleep(0)
    assert not waiter.done()  # woken, re-checked, waiting again
    views.apply(turn_records(2)[0])
    views.apply(turn_records(2)[1])
    assert await asyncio.wait_for(waiter, 1) is True
    assert views.waiting(CNV) == 0


async def test_erasure_wakes_waiters() -> None:
    views = ConversationViews()
    views.apply(started())
    waiter = asyncio.create_task(
        views.wait(CNV, lambda v: v is None or v.erased or v.last_seq > 1, 5))
    await asyncio.sleep(0)
    views.mark_erased(CNV)
    assert await asyncio.wait_for(waiter, 1) is True


def test_kept_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ConversationViews(kept=0)


def test_a_conversation_is_read_only_in_its_tenant_even_by_the_same_sub() -> None:
    views = ConversationViews()
    views.apply(started())                                            # alice in t1
    views.apply(started(key="cnv-0000000000000002", tenant="t2"))    # alice in t2
    assert views.owned(CNV, who("alice")) is not None
    assert views.owned(CNV, who("alice", "t2")) is None
    assert [v.conversation for v in views.list_for(who("alice", "t2"))] == [
        "cnv-0000000000000002"]
    assert views.in_tenant(CNV, "t2") is None and views.in_tenant(CNV, "t1") is views[CNV]


def test_a_turn_opened_is_kept_without_the_positions_it_names_for_its_step() -> None:
    """The positions (up to 1,000 pairs) are its step's alone: kept with every message of a
    long conversation, the view grew with the square of its length. What the edge serves of
    the record is unchanged: its message at its seq, its turn's request and Thinking."""
    from schemas.conversation import TranscriptRef, TurnOpened

    views = ConversationViews()
    views.apply(started())
    turn = turn_id(CNV, 2)
    opened = TurnOpened(conversation=CNV, message_id="m2", text=SEALED, turn=turn,
                        at="2025-01-01T00:00:00+00:00",
                        history=TranscriptRef(entries=[(n, 10 * n) for n in range(1, 1000)]))
    views.apply(env(opened, 2))
    view = views.by_key[CNV]
    kept = view.events_after(1)
    assert [e.seq for e in kept] == [2, 3, 4]
    message = kept[0].record
    assert isinstance(message, TurnOpened) and message.history is None
    assert view.content[2].record.history is None  # type: ignore[union-attr]
    assert message.model_dump(exclude={"history"}) == opened.model_dump(exclude={"history"})
    assert view.turn(turn).state == "Thinking" and view.turn(turn).message_seq == 2
    assert opened.history is not None, "the record applied is not changed"
