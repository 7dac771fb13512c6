"""Deadlines and the janitor (issue 12 point 3): every turn and workflow step ends, once.

The sequencers end a turn past its deadline (``ExpireTurn``, ``ExpireAssistantTurn``) and
refuse what a late step still sends; the janitor names the overdue turns of the partitions its
worker owns; the workflow runtime stops a step at its deadline and runs a workflow's turn-over
bookkeeping again when its worker died before it.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumers.assistant.sequencer import AssistantSequencer, AssistantState
from consumers.conversations.sequencer import ConversationSequencer, ConversationState
from consumers.frame.janitor import Janitor
from consumers.frame.writer import outputs
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef, WorkflowState
from consumers.workflows.runtime import WorkflowRuntime, partition_of
from schemas.assistant import (
    AppendDisplay,
    AssistantChat,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    DisplayPayload,
)
from schemas.base import Sealed
from schemas.conversation import (
    ExpireTurn,
    ReplyRecorded,
    SendMessage,
    StartConversation,
    TurnStateChanged,
)
from schemas.workflow import LeaseCheck, WorkflowCommandReceived, WorkflowStarted
from streams.crashpoints import CrashPoints
from streams.envelope import Envelope
from streams.producer import Publisher
from streams.settings import VoiceSettings
from streams.topics import ACKS, ASSISTANT, CONVERSATIONS
from tests.unit.test_workflow_runtime import FakeProducer

CNV = "cnv-00112233aabbccdd"
SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
DEADLINE_S = 60.0


def at(record: Any, id_: str, seconds: float = 0.0, key: str = CNV) -> Envelope:
    return Envelope(record=record, key=key, source="/test", id=id_,
                    time=T0 + timedelta(seconds=seconds))


def logged(out: list) -> list[Any]:
    return [e.record for spec, e in out if spec in (CONVERSATIONS, ASSISTANT)]


# --- participant turns -------------------------------------------------------------------


def conversation_with_a_turn() -> tuple[ConversationSequencer, ConversationState, str]:
    seq = ConversationSequencer(turn_deadline_s=DEADLINE_S)
    state, _ = outputs(seq, None, at(StartConversation(conversation=CNV, owner="alice"), "c1"))
    state, _ = outputs(seq, state, at(SendMessage(conversation=CNV, message_id="m1",
                                                  text=SEALED), "c2"))
    return seq, state, f"{CNV}:turn-2"


def test_a_participant_turn_past_its_deadline_ends_once_with_a_coded_reason() -> None:
    seq, state, turn = conversation_with_a_turn()
    assert seq.overdue(CNV, state.to_dict(), T0 + timedelta(seconds=DEADLINE_S - 1)) == []
    (expire,) = seq.overdue(CNV, state.to_dict(), T0 + timedelta(seconds=DEADLINE_S))
    assert expire == ExpireTurn(conversation=CNV, turn=turn)

    early, out = outputs(seq, state, at(expire, f"{turn}:early", DEADLINE_S - 1))
    assert logged(out) == [] and early is not None and turn in early.open_turns

    state, out = outputs(seq, state, at(expire, f"{turn}:deadline", DEADLINE_S + 1))
    (ended,) = logged(out)
    assert isinstance(ended, TurnStateChanged) and ended.state == "CouldNotInterpret"
    assert ended.reason_code == "DEADLINE_EXCEEDED" and ended.reason is None
    assert seq.overdue(CNV, state.to_dict(), T0 + timedelta(days=1)) == []

    # Ended once: the same expiry again, another one, and the late step's results change nothing.
    for n, late in enumerate((
            expire,
            ExpireTurn(conversation=CNV, turn=turn),
            ReplyRecorded(conversation=CNV, turn=turn, reply_id=f"{turn}:reply", text=SEALED),
            TurnStateChanged(conversation=CNV, turn=turn, state="Replied"))):
        before = state.seq
        state, out = outputs(seq, state, at(late, f"late-{n}", DEADLINE_S + 5))
        assert logged(out) == [] and state.seq == before, late


def test_a_turn_that_replied_in_time_is_never_expired() -> None:
    seq, state, turn = conversation_with_a_turn()
    state, out = outputs(seq, state, at(TurnStateChanged(conversation=CNV, turn=turn,
                                                         state="Replied"), f"{turn}:state", 5))
    assert [type(r).__name__ for r in logged(out)] == ["TurnStateChanged"]
    assert seq.overdue(CNV, state.to_dict(), T0 + timedelta(days=1)) == []
    state, out = outputs(seq, state, at(ExpireTurn(conversation=CNV, turn=turn),
                                        f"{turn}:deadline", DEADLINE_S + 1))
    assert logged(out) == []


def test_a_state_from_before_deadlines_still_takes_its_older_turns_results() -> None:
    seq, state, turn = conversation_with_a_turn()
    legacy = state.to_dict()
    del legacy["open_turns"], legacy["tracked_from"]
    loaded = seq.load(legacy)
    assert loaded is not None and loaded.tracked_from == state.seq + 1
    _, out = outputs(seq, loaded, at(
        TurnStateChanged(conversation=CNV, turn=turn, state="Replied"), f"{turn}:state", 5))
    assert [r.state for r in logged(out)] == ["Replied"]


# --- assistant turns ---------------------------------------------------------------------

CONV = str(uuid.UUID(int=7))


def chat(cid: str, seconds: float = 0.0, create: bool = False) -> Envelope:
    return at(AssistantChat(conversation=CONV, owner="alice", create=create,
                            message_id=f"m-{cid}", request=SEALED), cid, seconds, key=CONV)


def test_an_assistant_turn_past_its_deadline_ends_failed_and_the_next_chat_is_taken() -> None:
    seq = AssistantSequencer(turn_deadline_s=DEADLINE_S)
    state, out = outputs(seq, None, chat("c1", create=True))
    turn = state.running
    assert turn is not None
    busy_state, out = outputs(seq, state, chat("c2", 10))
    assert [e.record.detail["reason"] for s, e in out if s is ACKS] == ["busy"]

    (expire,) = seq.overdue(CONV, state.to_dict(), T0 + timedelta(seconds=DEADLINE_S))
    state, out = outputs(seq, state, at(expire, f"{turn}:deadline", DEADLINE_S, key=CONV))
    (ended,) = logged(out)
    assert isinstance(ended, AssistantTurnEnded) and ended.state == "Failed"
    assert ended.reason_code == "DEADLINE_EXCEEDED" and ended.reason is None
    assert state.running is None

    # The late step's display event, reply and end are not recorded: the turn ended once.
    payload = DisplayPayload(event_id="e1", type="text_delta", channel="response", ts=1.0,
                             data=SEALED, message_id=turn)
    for n, late in enumerate((
            AppendDisplay(conversation=CONV, turn=turn, event=payload),
            AssistantReplyRecorded(conversation=CONV, turn=turn, reply_id="r", chain=SEALED,
                                   cards=SEALED),
            AssistantTurnEnded(conversation=CONV, turn=turn, state="Replied"),
            expire)):
        state, out = outputs(seq, state, at(late, f"late-{n}", DEADLINE_S + 1, key=CONV))
        assert logged(out) == [], late

    state, out = outputs(seq, state, chat("c3", DEADLINE_S + 2))
    assert [e.record.outcome for s, e in out if s is ACKS] == ["accepted"]


def test_an_assistant_turn_records_one_reply_whatever_its_attempts_send() -> None:
    seq = AssistantSequencer(turn_deadline_s=DEADLINE_S)
    state, _ = outputs(seq, None, chat("c1", create=True))
    turn = state.running

    def reply(attempt: int) -> Envelope:
        return at(AssistantReplyRecorded(conversation=CONV, turn=turn,
                                         reply_id=f"{turn}/a{attempt}/persist", chain=SEALED,
                                         cards=SEALED), f"{turn}/a{attempt}/persist", 1, CONV)

    state, out = outputs(seq, state, reply(1))
    assert len(logged(out)) == 1
    state, out = outputs(seq, state, reply(2))  # the attempt re-run after its worker died
    assert logged(out) == []


def test_a_turn_running_since_before_deadlines_gets_one_from_the_janitor() -> None:
    seq = AssistantSequencer(turn_deadline_s=DEADLINE_S)
    state, _ = outputs(seq, None, chat("c1", create=True))
    legacy = AssistantState.from_dict({**state.to_dict(), "deadline": None})
    (expire,) = seq.overdue(CONV, legacy.to_dict(), T0)
    state, out = outputs(seq, legacy, at(expire, "x1", 100, key=CONV))
    assert logged(out) == [] and state.deadline is not None, "its clock starts now"
    assert seq.overdue(CONV, state.to_dict(), T0 + timedelta(seconds=100 + DEADLINE_S - 1)) == []
    (expire,) = seq.overdue(CONV, state.to_dict(), T0 + timedelta(seconds=100 + DEADLINE_S))
    state, out = outputs(seq, state, at(expire, "x2", 100 + DEADLINE_S, key=CONV))
    assert [r.state for r in logged(out)] == ["Failed"] and state.running is None


# --- the janitor -------------------------------------------------------------------------


def test_the_janitor_submits_expiries_only_for_its_own_partitions_and_not_again_at_once() -> None:
    seq = ConversationSequencer(turn_deadline_s=DEADLINE_S)
    table: dict[str, Any] = {}
    keys = [f"cnv-{i:016x}" for i in range(40)]
    for key in keys:
        state, _ = outputs(seq, None, at(StartConversation(conversation=key, owner="a"),
                                         f"{key}:s", key=key))
        state, _ = outputs(seq, state, at(SendMessage(conversation=key, message_id="m",
                                                      text=SEALED), f"{key}:m", key=key))
        state.tenant = "t1"
        table[key] = seq.dump(state)
    janitor = Janitor(partitions=6)
    janitor.watch(seq, table)
    mine = {0, 1}
    assert janitor.due(mine, T0 + timedelta(seconds=1)) == [], "none is due yet"
    due = janitor.due(mine, T0 + timedelta(seconds=DEADLINE_S + 1))
    owned = sorted(k for k in keys if partition_of(k, 6) in mine)
    assert owned and sorted(e.key for e in due) == owned
    assert all(isinstance(e.record, ExpireTurn) and e.id == f"{e.key}:turn-2:deadline"
               and e.tenant == "t1" for e in due)
    assert janitor.due(mine, T0 + timedelta(seconds=DEADLINE_S + 2)) == [], "sent already"


# --- workflow steps ----------------------------------------------------------------------


async def settle_loop(rt: WorkflowRuntime, producer: FakeProducer, seen: int = 0) -> int:
    """Feed the runtime the outcomes its tasks produced, as its agent would."""
    for _ in range(200):
        await asyncio.sleep(0.01)
        outcomes = [e for e in producer.sent[seen:] if e.type.endswith("step_outcome.v1")]
        if outcomes:
            for env in outcomes:
                await rt.handle(env, lambda: None, "tp0", 9)
            return len(producer.sent)
    raise AssertionError("no outcome")


async def test_a_step_past_its_deadline_fails_the_workflow_once_with_deadline_exceeded() -> None:
    ended: list[str] = []

    async def hangs(ctx: StepContext) -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def on_end(state: WorkflowState) -> None:
        ended.append(state.last_error or "")

    settings = VoiceSettings(step_deadline_s=0.05, step_attempts=3)
    producer = FakeProducer()
    table: dict[str, Any] = {}
    rt = WorkflowRuntime(settings, table, Publisher(settings, lambda: producer))  # type: ignore[arg-type, return-value]
    rt.register(WorkflowDef("k", (StepDef("reply", hangs),), on_end=on_end))
    await rt.handle(Envelope(record=WorkflowStarted(workflow="w1", kind="k"), key="w1",
                             source="/t", seq=1), lambda: None, "tp0", 1)
    await settle_loop(rt, producer)
    types = [e.type.split(".")[-2] for e in producer.sent if not e.type.endswith("outcome.v1")]
    assert types == ["step_started", "step_failed", "failed"], "not retried"
    failed = next(e.record for e in producer.sent if e.type.endswith("step_failed.v1"))
    assert failed.error_type == "DEADLINE_EXCEEDED" and "VOICE_STEP_DEADLINE_S" in failed.error
    assert table["w1"]["status"] == "failed" and table["w1"]["settled"] is True
    assert ended == [f"DEADLINE_EXCEEDED: {failed.error}"]


async def test_a_worker_dying_between_workflow_failed_and_its_bookkeeping_is_made_good() -> None:
    """Before: the next owner found the workflow ``failed``, acknowledged the redelivered
    record and never ran ``on_end`` — the assistant answered ``409 busy`` for good."""
    calls: list[str] = []

    async def fails(ctx: StepContext) -> dict[str, Any]:
        raise RuntimeError("no model")

    class Died(Exception):
        """Stands for the process dying inside on_end (nothing after it runs)."""

    async def dies(state: WorkflowState) -> None:
        raise Died

    async def turn_over(state: WorkflowState) -> None:
        calls.append(state.workflow)

    settings = VoiceSettings(step_attempts=1)
    table: dict[str, Any] = {}
    producer = FakeProducer()
    first = WorkflowRuntime(settings, table, Publisher(settings, lambda: producer))  # type: ignore[arg-type, return-value]
    first.register(WorkflowDef("k", (StepDef("s", fails),), on_end=dies))
    await first.handle(Envelope(record=WorkflowStarted(workflow="w1", kind="k"), key="w1",
                                source="/t", seq=1), lambda: None, "tp0", 1)
    with pytest.raises(Died):
        await settle_loop(first, producer)
    assert table["w1"]["status"] == "failed" and table["w1"]["settled"] is False

    # The partition's next owner (its table rebuilt from the changelog) probes the workflow.
    second = WorkflowRuntime(settings, table, Publisher(settings, lambda: producer))  # type: ignore[arg-type, return-value]
    second.register(WorkflowDef("k", (StepDef("s", fails),), on_end=turn_over))
    assert second.unheld({partition_of("w1", 6)}, 6) == ["w1"]
    acked: list[bool] = []
    probe = Envelope(record=LeaseCheck(workflow="w1"), key="w1", source="/t")
    await second.handle(probe, lambda: acked.append(True), "tp0", 2)
    assert calls == ["w1"] and acked == [True] and table["w1"]["settled"] is True
    await second.handle(probe, lambda: acked.append(True), "tp0", 3)
    assert calls == ["w1"], "settled: never twice"
    assert second.unheld({partition_of("w1", 6)}, 6) == []


def test_crash_points_are_inert_unless_named_and_refuse_an_unknown_point() -> None:
    assert CrashPoints.parse("").points == ()
    points = CrashPoints.parse("before_step@cnv-a, model_call")
    assert points.armed("before_step", "cnv-a:turn-2")
    assert not points.armed("before_step", "cnv-b:turn-2")
    assert points.armed("model_call", "anything")
    CrashPoints().hit("before_step", "w")  # nothing named: returns
    with pytest.raises(ValueError, match="'mid_air'"):
        CrashPoints.parse("mid_air")


async def test_a_failed_workflow_retried_before_its_bookkeeping_settles_at_its_next_end() -> None:
    ends: list[str] = []

    async def fails(ctx: StepContext) -> dict[str, Any]:
        raise RuntimeError("no model")

    async def dies(state: WorkflowState) -> None:
        raise RuntimeError("the worker died here")

    async def turn_over(state: WorkflowState) -> None:
        ends.append(state.status)

    settings = VoiceSettings(step_attempts=1)
    table: dict[str, Any] = {}
    producer = FakeProducer()
    first = WorkflowRuntime(settings, table, Publisher(settings, lambda: producer))  # type: ignore[arg-type, return-value]
    first.register(WorkflowDef("k", (StepDef("s", fails),), on_end=dies))
    await first.handle(Envelope(record=WorkflowStarted(workflow="w1", kind="k"), key="w1",
                                source="/t", seq=1, tenant="t1"), lambda: None, "tp0", 1)
    with pytest.raises(RuntimeError, match="died"):
        await settle_loop(first, producer)
    seen = len(producer.sent)

    second = WorkflowRuntime(settings, table, Publisher(settings, lambda: producer))  # type: ignore[arg-type, return-value]
    second.register(WorkflowDef("k", (StepDef("s", fails),), on_end=turn_over))
    retry = Envelope(record=WorkflowCommandReceived(workflow="w1", command="retry",
                                                    command_id="r1", by="op"),
                     key="w1", source="/t", tenant="t1", id="r1")
    await second.handle(retry, lambda: None, "tp0", 2)
    assert table["w1"]["status"] == "running" and ends == [], "no bookkeeping while it runs"
    await settle_loop(second, producer, seen)
    assert ends == ["failed"] and table["w1"]["settled"] is True
