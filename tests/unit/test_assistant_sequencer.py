"""The assistant conversation's sequencer: dense seqs and display seqs, one turn at a time,
ownership, dedupe, and determinism (a replayed command gives identical records)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from consumers.assistant.sequencer import AssistantSequencer, AssistantState
from consumers.frame.writer import outputs
from schemas.assistant import (
    AppendDisplay,
    AssistantChat,
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    DisplayPayload,
)
from schemas.base import Sealed
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope
from streams.ids import turn_conversation, turn_id
from streams.topics import ACKS, ASSISTANT

CONV = str(uuid.UUID(int=1))
SEALED = Sealed(key_version=1, nonce="AAAA", ciphertext="AAAA")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def sequence(state: AssistantState | None, c: Envelope) -> tuple[AssistantState | None, list]:
    """The writer's pure half (dedupe, decide, envelopes) for the assistant aggregate."""
    return outputs(AssistantSequencer(), state, c)


def chat(cid: str, owner: str = "alice", create: bool = False, idem: str | None = None
         ) -> Envelope:
    return Envelope(record=AssistantChat(conversation=CONV, owner=owner, create=create,
                                         message_id=f"m-{cid}", request=SEALED,
                                         idempotency_key=idem),
                    key=CONV, source="/test", id=cid, time=T0)


def display(cid: str, turn: str, type_: str = "text_delta") -> Envelope:
    payload = DisplayPayload(event_id=cid, type=type_, channel="response", ts=1.0, data=SEALED,
                             message_id=turn)
    return Envelope(record=AppendDisplay(conversation=CONV, turn=turn, event=payload),
                    key=CONV, source="/test", id=cid, time=T0)


def ended(turn: str) -> Envelope:
    return Envelope(record=AssistantTurnEnded(conversation=CONV, turn=turn, state="Replied"),
                    key=CONV, source="/test", id=f"{turn}:end", time=T0)


def acks(outputs: list) -> list[CommandAcknowledged]:
    return [env.record for spec, env in outputs if spec is ACKS]


def logged(outputs: list) -> list[Envelope]:
    return [env for spec, env in outputs if spec is ASSISTANT]


def test_first_chat_opens_the_conversation_and_requests_a_turn() -> None:
    state, out = sequence(None, chat("c1", create=True))
    assert state is not None and state.owner == "alice" and state.running == turn_id(CONV, 2)
    recs = logged(out)
    assert [type(e.record) for e in recs] == [AssistantConversationStarted, AssistantTurnRequested]
    assert [e.seq for e in recs] == [1, 2]
    (ack,) = acks(out)
    assert ack.outcome == "accepted" and ack.seq == 2
    assert ack.detail["turn"] == f"{CONV}:turn-2" and ack.detail["after"] == 0
    assert turn_conversation(str(ack.detail["turn"])) == CONV


def test_display_events_get_dense_display_seqs_and_duplicates_are_dropped() -> None:
    state, _ = sequence(None, chat("c1", create=True))
    turn = state.running
    seqs = []
    for i in range(1, 4):
        state, out = sequence(state, display(f"{turn}/a1/d{i}", turn))
        (env,) = logged(out)
        assert isinstance(env.record, AssistantDisplayRecorded) and not acks(out)
        seqs.append((env.seq, env.record.display_seq))
    assert seqs == [(3, 1), (4, 2), (5, 3)]
    again, out = sequence(state, display(f"{turn}/a1/d2", turn))  # redelivered
    assert out == [] and again.display_seq == 3 and again.seq == 5


def test_one_turn_at_a_time_and_the_next_starts_after_the_last_display_seq() -> None:
    state, _ = sequence(None, chat("c1", create=True))
    turn = state.running
    state, _ = sequence(state, display("d1", turn))
    state, out = sequence(state, chat("c2"))
    (ack,) = acks(out)
    assert ack.outcome == "rejected" and ack.detail == {"reason": "busy", "turn": turn}
    state, _ = sequence(state, ended(turn))
    assert state.running is None
    state, out = sequence(state, chat("c3"))
    (ack,) = acks(out)
    assert ack.outcome == "accepted" and ack.detail["after"] == 1
    assert logged(out)[0].record.after == 1


def test_another_owner_or_an_unknown_conversation_is_no_such_conversation() -> None:
    _, out = sequence(None, chat("c0"))
    assert acks(out)[0].detail == {"reason": "no such conversation"}
    state, _ = sequence(None, chat("c1", create=True))
    _, out = sequence(state, chat("c2", owner="mallory"))
    assert acks(out)[0].outcome == "rejected" and not logged(out)
    assert acks(out)[0].detail == {"reason": "no such conversation"}


def test_a_repeated_command_or_idempotency_key_gets_the_first_answer() -> None:
    state, _ = sequence(None, chat("c1", create=True, idem="k"))
    _, out = sequence(state, chat("c1", create=True, idem="k"))
    (ack,) = acks(out)
    assert ack.outcome == "duplicate" and ack.seq == 2 and not logged(out)
    _, out = sequence(state, chat("c9", idem="k"))
    (ack,) = acks(out)
    assert ack.outcome == "duplicate" and ack.detail["turn"] == f"{CONV}:turn-2"


def test_sequence_is_pure_and_deterministic() -> None:
    state, _ = sequence(None, chat("c1", create=True))
    before = state.to_dict()
    a = sequence(AssistantState.from_dict(before), display("d1", state.running))
    b = sequence(AssistantState.from_dict(before), display("d1", state.running))
    assert state.to_dict() == before
    assert [(s, e.id, e.seq, e.record) for s, e in a[1]] == [(s, e.id, e.seq, e.record)
                                                             for s, e in b[1]]
