"""A step's outcome applied where the step ran (``WorkflowDef.outcome_recorded`` false, a
turn's kinds): no ``StepOutcome`` record, the same lifecycle records and state as when the
outcome came back as a record, the lease's record acknowledged once when the workflow ends —
and the record all the same when the task holds no lease (issue 14)."""

from __future__ import annotations

import asyncio
from typing import Any

import faust.streams
from faust.types import TP

from consumers.workflows.engine import StepContext, StepDef, WorkflowDef
from consumers.workflows.runtime import WorkflowRuntime
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope
from streams.producer import Publisher
from streams.settings import VoiceSettings
from tests.unit.test_workflow_runtime import FakeProducer, retried_then_next

OUTCOME = "voice.workflow.step_outcome.v1"
TP0 = TP("voice.workflows", 0)


class Message:
    def __init__(self, offset: int) -> None:
        self.tp, self.offset, self.partition, self.topic = TP0, offset, 0, TP0.topic


class Event:
    """Stands for Faust's event of a consumed record: the runtime is handed its ``ack``."""

    def __init__(self, offset: int) -> None:
        self.message = Message(offset)
        self.acks = 0

    def ack(self) -> None:
        self.acks += 1


class WatchedTable(dict[str, Any]):
    """A table noting, at each write, Faust's current event and what was in flight."""

    def __init__(self, rt: list[WorkflowRuntime]) -> None:
        super().__init__()
        self.rt = rt
        self.writes: list[tuple[str, Any, list[Any]]] = []

    def __setitem__(self, key: str, value: Any) -> None:
        self.writes.append((value["status"], faust.streams.current_event(),
                            self.rt[0].in_flight.records() if self.rt else []))
        super().__setitem__(key, value)


def runtime(*steps: StepDef, recorded: bool = False
            ) -> tuple[WorkflowRuntime, FakeProducer, WatchedTable]:
    producer = FakeProducer()
    holder: list[WorkflowRuntime] = []
    table = WatchedTable(holder)
    rt = WorkflowRuntime(VoiceSettings(), table,
                         Publisher(VoiceSettings(), lambda: producer))  # type: ignore[arg-type, return-value]
    holder.append(rt)
    rt.register(WorkflowDef("k", steps, outcome_recorded=recorded))
    return rt, producer, table


async def settle(rt: WorkflowRuntime, table: dict[str, Any]) -> None:
    for _ in range(200):
        await asyncio.sleep(0)
        if table.get("w1", {}).get("status") != "running" and not rt.tasks:
            return


def start() -> Envelope:
    return Envelope(record=WorkflowStarted(workflow="w1", kind="k"), key="w1", source="/t",
                    seq=1, id="w1:1")


async def one(ctx: StepContext) -> dict[str, Any]:
    return {"n": ctx.attempt}


async def test_the_outcome_is_applied_in_the_steps_task_with_no_record_of_its_own() -> None:
    rt, producer, table = runtime(StepDef("a", one))
    event = Event(offset=5)
    await rt.handle(start(), event.ack, TP0, 5)
    assert event.acks == 0, "the start holds the lease while the step runs"
    await settle(rt, table)
    types = [type(e.record).__name__ for e in producer.sent]
    assert types == ["StepStarted", "LastStepSucceeded"], types
    assert table["w1"]["status"] == "completed" and table["w1"]["outputs"]["a"] == {"n": 1}
    assert event.acks == 1 and rt._held == {} and rt.tasks == {}
    # The write that ended it was made as if handling the lease's record: Faust's current
    # event (the changelog's partition, the write-behind's cause), counted in flight.
    status, current, in_flight = table.writes[-1]
    assert status == "completed" and current is event
    assert [(r.topic, r.partition, r.offset, r.key) for r in in_flight] == [
        (rt.topic, 0, 5, b"w1")]
    assert rt.in_flight.records() == [] and faust.streams.current_event() is None


async def test_each_step_of_many_hands_on_in_place_and_the_lease_stays_with_the_start() -> None:
    calls: list[tuple[str, int]] = []
    rt, producer, table = runtime(*retried_then_next(calls))
    event = Event(offset=7)
    await rt.handle(start(), event.ack, TP0, 7)
    await settle(rt, table)
    lifecycle = [(type(e.record).__name__, getattr(e.record, "attempt", None))
                 for e in producer.sent]
    # The same records, in the same order and seqs, as when each outcome was a record.
    assert lifecycle == [("StepStarted", 1), ("StepFailed", 1), ("StepStarted", 2),
                         ("StepSucceeded", 2), ("StepStarted", 1), ("LastStepSucceeded", 1)]
    assert [e.seq for e in producer.sent] == [2, 3, 4, 5, 6, 7]
    assert calls == [("a", 1), ("a", 2), ("b", 1)]
    assert event.acks == 1 and table["w1"]["status"] == "completed"


async def test_without_a_lease_the_outcome_is_recorded_as_for_any_kind() -> None:
    """A handover under way (``release_leases``): the task holds no lease, so its outcome
    goes on the log for the partition's owner, as before."""
    release = asyncio.Event()

    async def held(ctx: StepContext) -> dict[str, Any]:
        await release.wait()
        return {"n": 1}

    rt, producer, table = runtime(StepDef("a", held))
    event = Event(offset=3)
    await rt.handle(start(), event.ack, TP0, 3)
    await asyncio.sleep(0)
    rt.release_leases()
    assert event.acks == 1
    release.set()
    for _ in range(50):
        await asyncio.sleep(0)
    types = [e.type for e in producer.sent]
    assert types[-1] == OUTCOME and table["w1"]["status"] == "running", types
    # Its owner applies the record as it always has.
    rt.keep_only(set())
    outcome = producer.sent[-1]
    await rt.handle(outcome, Event(offset=4).ack, TP0, 4)
    assert table["w1"]["status"] == "completed"


async def test_a_kind_that_records_its_outcome_still_does() -> None:
    rt, producer, table = runtime(StepDef("a", one), recorded=True)
    event = Event(offset=5)
    await rt.handle(start(), event.ack, TP0, 5)
    for _ in range(50):
        await asyncio.sleep(0)
    assert [e.type for e in producer.sent][-1] == OUTCOME
    assert table["w1"]["status"] == "running" and event.acks == 0
