"""The conversation sequencer's pure logic: dense seqs, idempotency, single writer rules."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from consumers.conversations.sequencer import ConversationSequencer, ConversationState
from consumers.frame.writer import outputs
from schemas.base import Sealed
from schemas.conversation import (
    ConversationStarted,
    EraseConversation,
    ProposalRecorded,
    RecordTurnResults,
    ReplyRecorded,
    SendMessage,
    StartConversation,
    TurnOpened,
    TurnReplied,
    TurnRepliedWithProposal,
    TurnRequested,
    TurnStateChanged,
)
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope, unfolded
from streams.topics import ACKS, CONVERSATIONS

CNV = "cnv-00112233aabbccdd"
SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")


def sequence(state: ConversationState | None, c: Envelope) -> tuple[ConversationState | None,
                                                                      list]:
    """The writer's pure half (dedupe, decide, envelopes) for the conversation aggregate."""
    return outputs(ConversationSequencer(), state, c)


def cmd(record, id_: str | None = None) -> Envelope:  # noqa: ANN001
    kw = {"id": id_} if id_ else {}
    return Envelope(record=record, key=CNV, source="/test", **kw)


def send(key: str | None = None, id_: str | None = None) -> Envelope:
    return cmd(SendMessage(conversation=CNV, message_id="m1", text=SEALED, idempotency_key=key),
               id_)


def test_start_then_messages_get_dense_seqs() -> None:
    state, out = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice")))
    assert [(s, e.seq, type(e.record)) for s, e in out] == [
        (CONVERSATIONS, 1, ConversationStarted), (ACKS, None, CommandAcknowledged)]
    state, out = sequence(state, send(id_="cmd"))
    # One record for the message and the turn it opens; unfolded, the three of before.
    assert [(e.seq, type(e.record)) for s, e in out if s is CONVERSATIONS] == [(2, TurnOpened)]
    log = [(e.seq, type(e.record), e.id) for s, e in out if s is CONVERSATIONS
           for e in unfolded(e)]
    assert log == [(2, TurnOpened, "cmd-2"), (3, TurnRequested, "cmd-2/1"),
                   (4, TurnStateChanged, "cmd-2/2")]
    requested, thinking = (e.record for s, e in out if s is CONVERSATIONS
                           for e in unfolded(e)[1:])
    assert requested == TurnRequested(conversation=CNV, turn=f"{CNV}:turn-2", message_seq=2)
    assert thinking == TurnStateChanged(conversation=CNV, turn=f"{CNV}:turn-2",
                                        state="Thinking")
    ack = out[-1][1].record
    assert ack.outcome == "accepted" and ack.seq == 2
    assert ack.detail["turn"] == f"{CNV}:turn-2"
    state, out = sequence(state, send())
    assert [e.seq for s, e in out if s is CONVERSATIONS] == [5]
    assert state is not None and state.seq == 7


def test_idempotency_key_answers_the_original_and_records_nothing() -> None:
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice")))
    state, first = sequence(state, send("k1"))
    state, again = sequence(state, send("k1"))
    assert [s for s, _ in again] == [ACKS]
    ack = again[0][1].record
    assert ack.outcome == "duplicate" and ack.seq == first[-1][1].record.seq
    assert ack.detail["turn"] == first[-1][1].record.detail["turn"]


def test_redelivered_command_is_not_applied_twice() -> None:
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice")))
    state, _ = sequence(state, send(id_="c1"))
    seq = state.seq
    state, out = sequence(state, send(id_="c1"))
    assert state.seq == seq and [s for s, _ in out] == [ACKS]


def test_a_redelivered_message_with_a_key_is_answered_by_its_key_and_remembered_once(
) -> None:
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice"), "c0"))
    state, first = sequence(state, send("k1", id_="c1"))
    assert state is not None and set(state.commands) == {"c0", "idem:k1"}, "one memo a message"
    seq = state.seq
    state, again = sequence(state, send("k1", id_="c1"))  # the same command, redelivered
    assert state is not None and state.seq == seq and [s for s, _ in again] == [ACKS]
    ack, original = again[0][1].record, first[-1][1].record
    assert (ack.command_id, ack.outcome, ack.seq, ack.detail) == (
        "c1", "duplicate", original.seq, original.detail)


def test_a_message_is_remembered_by_its_seq_alone_and_answered_again_in_full() -> None:
    """A message sent without a key is remembered by its command id as its seq alone (its turn
    and time follow from the command): a redelivery, the same record, is answered exactly as
    the first time; a state that kept the whole memo (written before) is answered from it."""
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice"), "c0"))
    message = send(id_="c1")
    state, first = sequence(state, message)
    assert state is not None and state.commands["c1"] == {"seq": 2}
    original = first[-1][1].record
    assert set(original.detail) == {"turn", "at"}
    state, again = sequence(state, message)
    assert state is not None and [s for s, _ in again] == [ACKS]
    ack = again[0][1].record
    assert (ack.outcome, ack.seq, ack.detail) == ("duplicate", original.seq, original.detail)
    state.commands["c1"] = {"seq": 2, "turn": "as-it-was", "at": "then"}  # an older state
    _, older = sequence(state, message)
    assert older[0][1].record.detail == {"turn": "as-it-was", "at": "then"}


def test_a_long_conversations_state_keeps_a_few_bytes_a_message() -> None:
    """Six hundred messages: the memories of their commands stay ~50 bytes each (the whole
    answer was ~130), and the state stays well under what it was (137 KB at 700 turns)."""
    import json

    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice"), "c0"))
    for n in range(600):
        state, _ = sequence(state, cmd(SendMessage(conversation=CNV, message_id=f"m{n}",
                                                   text=SEALED), f"{n:032x}"))
    assert state is not None
    assert len(json.dumps(state.commands)) < 600 * 60


def test_replay_from_older_state_gives_identical_seqs() -> None:
    """A crash before the table write replays the command: same records, same seqs."""
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice")))
    saved = ConversationState.from_dict(state.to_dict())
    c = send(id_="c9")
    _, out1 = sequence(state, c)
    _, out2 = sequence(saved, c)
    assert [(e.seq, e.record, e.id) for _, e in out1] == [(e.seq, e.record, e.id) for _, e in out2]


def test_unknown_or_erased_conversation_is_rejected() -> None:
    _, out = sequence(None, send())
    assert out[0][1].record.outcome == "rejected"
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice")))
    state, _ = sequence(state, cmd(EraseConversation(conversation=CNV)))
    assert state.erased
    _, out = sequence(state, send())
    assert out[0][1].record.outcome == "rejected"


def test_start_twice_is_rejected() -> None:
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice")))
    _, out = sequence(state, cmd(StartConversation(conversation=CNV, owner="bob")))
    assert out[0][1].record.outcome == "rejected" and state.owner == "alice"


def _results(turn: str, **parts: object) -> Envelope:
    reply = ReplyRecorded(conversation=CNV, turn=turn, reply_id=f"{turn}:reply", text=SEALED)
    return cmd(RecordTurnResults(
        conversation=CNV, turn=turn, reply=parts.get("reply", reply),
        ended=TurnStateChanged(conversation=CNV, turn=turn, state="Replied")),
        f"{turn}:results")


def test_a_turns_results_are_one_command_appended_in_order_unanswered() -> None:
    """The step's one command appends reply and end as the two commands did, answers nobody,
    and keeps the state no larger than before the turn (nothing remembered)."""
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice")))
    state, out = sequence(state, send(id_="c1"))
    turn = out[-1][1].record.detail["turn"]
    remembered = dict(state.commands)
    state, out = sequence(state, _results(turn))
    # The reply carries the turn's end: one record holding the two seqs of before.
    assert [(s, e.seq, type(e.record)) for s, e in out] == [(CONVERSATIONS, 5, TurnReplied)]
    parts = unfolded(out[0][1])
    assert [(e.seq, type(e.record), e.id) for e in parts] == [
        (5, TurnReplied, f"{turn}:results-5"), (6, TurnStateChanged, f"{turn}:results-5/1")]
    assert parts[1].record.state == "Replied" and turn not in state.open_turns
    assert state.seq == 6 and state.commands == remembered


def test_a_turn_with_a_proposal_folds_reply_proposal_and_end_in_log_order() -> None:
    """Reply, proposal, end: one record holding the three seqs, in that order; a turn that
    ends otherwise (cancelled, could not interpret) records each as before."""
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice")))
    state, out = sequence(state, send(id_="c1"))
    turn = out[-1][1].record.detail["turn"]
    proposal = ProposalRecorded(conversation=CNV, turn=turn, proposal_id=f"{turn}:proposal",
                                proposal=SEALED)
    reply = ReplyRecorded(conversation=CNV, turn=turn, reply_id=f"{turn}:reply", text=SEALED)
    results = cmd(RecordTurnResults(
        conversation=CNV, turn=turn, reply=reply, proposal=proposal,
        ended=TurnStateChanged(conversation=CNV, turn=turn, state="Replied")), "r")
    state, out = sequence(state, results)
    assert [(e.seq, type(e.record)) for _, e in out] == [(5, TurnRepliedWithProposal)]
    assert [(e.seq, e.record) for e in unfolded(out[0][1])] == [
        (5, out[0][1].record), (6, proposal),
        (7, TurnStateChanged(conversation=CNV, turn=turn, state="Replied"))]
    assert ReplyRecorded(**out[0][1].record.model_dump(exclude={"proposal_id", "proposal"})
                         ) == reply
    assert state.seq == 7
    coded = RecordTurnResults(conversation=CNV, turn=turn, reply=reply, proposal=proposal,
                              ended=TurnStateChanged(conversation=CNV, turn=turn,
                                                     state="CouldNotInterpret",
                                                     reason_code="cancelled"))
    assert [type(r) for r in coded.parts()] == [ReplyRecorded, ProposalRecorded,
                                                TurnStateChanged]


def test_redelivered_results_are_dropped_without_a_table_write() -> None:
    """A step re-run (or a redelivery) submits the same results: the closed turn refuses
    them, with no records, no answer and no new state (``None``: the table is not written)."""
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice")))
    state, out = sequence(state, send(id_="c1"))
    turn = out[-1][1].record.detail["turn"]
    state, _ = sequence(state, _results(turn))
    again, out = sequence(state, _results(turn))
    assert again is None and out == []


def test_results_of_another_turn_or_that_leave_it_thinking_are_refused_by_the_schema() -> None:
    turn = f"{CNV}:turn-2"
    with pytest.raises(ValidationError, match="turn-9"):
        RecordTurnResults(conversation=CNV, turn=turn, reply=ReplyRecorded(
            conversation=CNV, turn=f"{CNV}:turn-9", reply_id="r", text=SEALED),
            ended=TurnStateChanged(conversation=CNV, turn=turn, state="Replied"))
    with pytest.raises(ValidationError, match="Thinking"):
        RecordTurnResults(conversation=CNV, turn=turn,
                          ended=TurnStateChanged(conversation=CNV, turn=turn, state="Thinking"))


def test_a_loaded_or_dumped_state_shares_nothing_a_command_changes() -> None:
    """``ConversationState`` copies only the containers a command changes in place (issue 14,
    eleventh pass): changing them on a loaded state, or on a state after its dump, leaves the
    table's value as it was."""
    state, _ = sequence(None, cmd(StartConversation(conversation=CNV, owner="alice"), "c0"))
    state, _ = sequence(state, cmd(SendMessage(conversation=CNV, message_id="m1", text=SEALED,
                                               idempotency_key="k1"), "c1"))
    assert state is not None
    state.transcript = {**(state.transcript or {}), "entries": [{"seq": 2, "offset": 7,
                                                                  "bytes": 8}]}
    raw = state.to_dict()
    snapshot = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for changed in (ConversationState.from_dict(raw), state):
        changed.commands["c9"] = {"seq": 9}
        changed.commands.pop("idem:k1")
        changed.open_turns.clear()
        assert changed.transcript is not None
        changed.transcript["entries"] = []
        changed.transcript["omitted_through"] = 5
        assert raw == snapshot
