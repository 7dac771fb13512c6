"""Folded conversation records (issue 14): a message opening its turn (``TurnOpened``) and a
reply ending it, with its proposal if any (``TurnReplied``, ``TurnRepliedWithProposal``), are
one record each on the log, holding the seqs of the
records they stand for. Every reader sees what it saw before they were folded: the edge's
views, SSE events and ids, older events read from the log, the log's dense seqs."""

from __future__ import annotations

import asyncio

from api.conversations import render
from api.conversations.views import ConversationViews
from schemas.base import Record, registry
from schemas.conversation import (
    ConversationStarted,
    MessageRecorded,
    ProposalRecorded,
    ReplyRecorded,
    TurnOpened,
    TurnReplied,
    TurnRepliedWithProposal,
    TurnRequested,
    TurnStateChanged,
)
from streams.envelope import Envelope, last_seq, unfolded
from streams.ids import turn_id
from streams.sealing import MemoryKeyStore, Sealer

CNV = "cnv-00112233aabbccdd"
AT = "2026-01-01T00:00:00+00:00"


def conversation(sealer: Sealer, folded: bool) -> list[Envelope]:
    """Two turns (the second with a proposal), as the sequencer appends them: with folded
    records, or as it did before (one record per seq)."""
    records: list[Record] = [ConversationStarted(conversation=CNV, owner="alice")]
    seq = 2
    for n, with_proposal in ((1, False), (2, True)):
        turn, mid, rid = turn_id(CNV, seq), f"m{n}", f"{turn_id(CNV, seq)}:reply"
        text = sealer.seal(CNV, mid, f"message {n}")
        if folded:
            records.append(TurnOpened(conversation=CNV, message_id=mid, text=text, at=AT,
                                      turn=turn))
        else:
            records += [MessageRecorded(conversation=CNV, message_id=mid, text=text, at=AT),
                        TurnRequested(conversation=CNV, turn=turn, message_seq=seq),
                        TurnStateChanged(conversation=CNV, turn=turn, state="Thinking")]
        reply = ReplyRecorded(conversation=CNV, turn=turn, reply_id=rid,
                              text=sealer.seal(CNV, rid, f"reply {n}"))
        replied = TurnStateChanged(conversation=CNV, turn=turn, state="Replied")
        if with_proposal:
            pid = f"{turn}:proposal"
            sealed = sealer.seal_json(CNV, pid, {"n": n})
            if folded:
                records.append(TurnRepliedWithProposal(**reply.model_dump(), proposal_id=pid,
                                                       proposal=sealed))
            else:
                records += [reply, ProposalRecorded(conversation=CNV, turn=turn,
                                                    proposal_id=pid, proposal=sealed), replied]
        elif folded:
            records.append(TurnReplied(**reply.model_dump()))
        else:
            records += [reply, replied]
        seq = 2 + sum(r.seqs for r in records[1:])
    envs, seq = [], 1
    for i, r in enumerate(records):
        envs.append(Envelope(record=r, key=CNV, source="/voice/sequencer", seq=seq,
                             tenant="t1", id=f"r{i}"))
        seq += r.seqs
    return envs


def wire(sealer: Sealer, envs: list[Envelope]) -> list[tuple[str | None, str | None, str]]:
    out = []
    for env in envs:
        sse = render.sse_event(sealer, env)
        if sse is not None:
            out.append((sse.event, sse.id, sse.data.model_dump_json()))
    return out


def test_each_folded_type_implies_one_record_per_further_seq_it_holds() -> None:
    assert {ce for ce, m in registry().items() if m.seqs > 1} == {
        TurnOpened.ce_type, TurnReplied.ce_type, TurnRepliedWithProposal.ce_type}
    sealer = Sealer(MemoryKeyStore())
    for env in conversation(sealer, True):
        assert env.seq is not None and len(env.record.implied(env.seq)) == env.record.seqs - 1


def test_the_edge_renders_folded_records_as_it_rendered_the_separate_ones() -> None:
    sealer = Sealer(MemoryKeyStore())
    seen = []
    for folded in (False, True):
        log = conversation(sealer, folded)
        views = ConversationViews()
        for env in log:
            views.apply(env)
        view = views[CNV]
        seen.append((view.last_seq, [e.seq for e in view.events],
                     wire(sealer, view.events_after(0)),
                     render.conversation_out(sealer, view).model_dump(),
                     [render.turn_out(sealer, tv).model_dump() for tv in view.turns.values()]))
    assert len(conversation(sealer, True)) == 5 and len(conversation(sealer, False)) == 12
    assert seen[0] == seen[1]
    last, seqs, events, _, turns = seen[1]
    assert last == 12 and seqs == list(range(1, 13))
    assert [(e, i) for e, i, _ in events] == [
        ("message", "2"), ("turn", "4"), ("message", "5"), ("turn", "6"), ("message", "7"),
        ("turn", "9"), ("message", "10"), ("proposal", "11"), ("turn", "12")]
    assert [t["state"] for t in turns] == ["Replied", "Replied"]


def test_a_folded_record_applied_again_changes_nothing() -> None:
    sealer = Sealer(MemoryKeyStore())
    log = conversation(sealer, True)
    views = ConversationViews()
    for env in log:
        views.apply(env)
    assert all(views.apply(env) is None for env in log[1:])
    assert views[CNV].last_seq == 12


class GapReader:
    """Records with seq in ``(after, upto]`` as the log reader finds them (by their own seq)."""

    def __init__(self, records: list[Envelope]) -> None:
        self.records = records

    def __call__(self, key: str, after: int, upto: int, since_ms: int | None = None
                 ) -> list[Envelope]:
        return [e for e in self.records if e.key == key and e.seq is not None
                and after < e.seq <= upto]


def test_older_events_from_inside_a_folded_record_are_read_each_once() -> None:
    """A cursor on the message of a folded record (its Thinking still to send) is served
    from the log: the record is read from before the cursor and unfolded."""
    sealer = Sealer(MemoryKeyStore())
    log = conversation(sealer, True)
    views = ConversationViews(kept=2, gap=GapReader(log))
    for env in log:
        views.apply(env)
    oldest = views[CNV].oldest_cursor()
    assert oldest == 10
    older = asyncio.run(views.older(CNV, 2, oldest))  # after the first message (seq 2)
    assert [e.seq for e in older] == list(range(3, 11))
    assert [type(e.record) for e in older[:2]] == [TurnRequested, TurnStateChanged]
    assert [last_seq(e) for e in log] == [1, 4, 6, 9, 12]


def test_unfolded_records_carry_the_folded_ones_headers_and_their_own_ids() -> None:
    sealer = Sealer(MemoryKeyStore())
    opened = conversation(sealer, True)[1]
    parts = unfolded(opened)
    assert [(p.seq, p.id, p.tenant, p.time) for p in parts] == [
        (2, "r1", "t1", opened.time), (3, "r1/1", "t1", opened.time),
        (4, "r1/2", "t1", opened.time)]
    assert parts[1].record == TurnRequested(conversation=CNV, turn=turn_id(CNV, 2),
                                            message_seq=2)
