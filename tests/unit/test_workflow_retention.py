"""A worker forgets a workflow once it has ended, settled, and ``VOICE_WORKFLOW_RETAIN_S``
has passed (``WorkflowsForgotten``): its table holds what ran lately, not all that ever ran.
Nothing else is forgotten, and what comes of a forgotten workflow later changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from consumers.workflows import runtime
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef
from consumers.workflows.runtime import WorkflowRuntime
from schemas.workflow import (
    FORGET_AT_MOST,
    LeaseCheck,
    StepOutcome,
    WorkflowCommandReceived,
    WorkflowsForgotten,
    WorkflowStarted,
)
from streams.envelope import Envelope
from streams.producer import Publisher
from streams.settings import VoiceSettings
from streams.topics import partition_of
from tests.unit.test_workflow_runtime import FakeProducer

PARTITIONS = 6
EVERY = set(range(PARTITIONS))


class Clock:
    """``time.time`` and ``time.monotonic`` of the runtime, moved by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.wall, self.mono = 1_000_000.0, 500.0
        monkeypatch.setattr(runtime.time, "time", lambda: self.wall)
        monkeypatch.setattr(runtime.time, "monotonic", lambda: self.mono)

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def make(retain_s: float = 100.0) -> tuple[WorkflowRuntime, dict[str, Any], FakeProducer]:
    settings = VoiceSettings(workflow_retain_s=retain_s, step_attempts=1,
                             topic_partitions=PARTITIONS)
    producer, table = FakeProducer(), {}
    rt = WorkflowRuntime(settings, table, Publisher(settings, lambda: producer))  # type: ignore[arg-type, return-value]
    return rt, table, producer


def register(rt: WorkflowRuntime, release: asyncio.Event | None = None) -> None:
    async def step(ctx: StepContext) -> dict[str, Any]:
        if release is not None and ctx.workflow.startswith("slow"):
            await release.wait()
        if ctx.workflow.startswith("bad"):
            raise RuntimeError("no")
        return {"ok": True}

    rt.register(WorkflowDef("k", (StepDef("s", step),)))


async def run(rt: WorkflowRuntime, producer: FakeProducer, workflow: str, offset: int,
              tp: str = "tp") -> None:
    """Start ``workflow`` (its record at ``offset``) and hand its outcome back at once."""
    await rt.handle(Envelope(record=WorkflowStarted(workflow=workflow, kind="k"),
                             key=workflow, source="/t", seq=1), lambda: None, tp, offset)
    for _ in range(50):
        await asyncio.sleep(0)
        outcome = next((e for e in producer.sent if e.type == "voice.workflow.step_outcome.v1"
                        and e.key == workflow), None)
        if outcome is not None:
            await rt.handle(outcome, lambda: None, tp, offset + 1)
            return


def look(rt: WorkflowRuntime, clock: Clock) -> list[WorkflowsForgotten]:
    """A look at every workflow (forced: readiness changed), then what it found."""
    rt.unheld(EVERY, PARTITIONS, ready=False)
    clock.advance(0.001)
    rt.unheld(EVERY, PARTITIONS, ready=True)
    return rt.forgettable()


async def forget(rt: WorkflowRuntime, rec: WorkflowsForgotten, tp: str = "tp") -> list[str]:
    acked: list[str] = []
    await rt.handle(Envelope(record=rec, key=rec.workflows[0], source="/t"),
                    lambda: acked.append("ack"), tp, 10_000)
    assert acked == ["ack"]
    return acked


async def test_an_ended_workflow_is_forgotten_once_its_retention_has_passed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    rt, table, producer = make(retain_s=100)
    register(rt)
    await run(rt, producer, "w1", 1)
    await run(rt, producer, "bad1", 3)  # failed (no more attempts), settled: forgotten too
    assert table["w1"]["status"] == "completed" and table["bad1"]["status"] == "failed"
    assert table["w1"]["ended_at"] == clock.wall and table["w1"]["ended_offset"] == 2
    assert look(rt, clock) == [], "ended a moment ago"
    clock.advance(99)
    assert look(rt, clock) == []
    clock.advance(2)
    records = look(rt, clock)
    assert sorted(w for r in records for w in r.workflows) == ["bad1", "w1"]
    assert all(len({partition_of(w, PARTITIONS) for w in r.workflows}) == 1 for r in records)
    assert rt.forgettable() == [], "each is named once a look"
    for rec in records:
        await forget(rt, rec)
    assert table == {}
    assert rt._locks == {}


async def test_nothing_running_waiting_unsettled_or_ended_later_is_forgotten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    rt, table, producer = make(retain_s=100)
    register(rt)
    await run(rt, producer, "old", 1)
    table["paused"] = {"status": "paused", "settled": True}
    table["unsettled"] = {"status": "failed", "settled": False, "ended_at": 0.0}
    table["running"] = {"status": "running", "settled": True}
    clock.advance(200)
    await run(rt, producer, "young", 5)
    ended_before = clock.wall - 100
    named = ["old", "paused", "unsettled", "running", "young"]
    by_partition: dict[int, list[str]] = {}
    for w in named:
        by_partition.setdefault(partition_of(w, PARTITIONS), []).append(w)
    # Records naming them all (as a buggy or hostile producer might): each is checked again.
    for workflows in by_partition.values():
        await forget(rt, WorkflowsForgotten(workflows=workflows, ended_before=ended_before))
    assert sorted(table) == ["paused", "running", "unsettled", "young"]
    # The look itself names only "old": nothing else is past its retention and ended.
    table["old"] = {"status": "completed", "settled": True, "ended_at": 0.0}
    assert [r.workflows for r in look(rt, clock)] == [["old"]]


async def test_a_record_forgets_only_its_own_partition_s_workflows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    rt, table, producer = make(retain_s=1)
    register(rt)
    names = [f"w{n}" for n in range(40)]
    for n, w in enumerate(names):
        await run(rt, producer, w, 10 * n)
    clock.advance(5)
    first = names[0]
    others = [w for w in names if partition_of(w, PARTITIONS) != partition_of(first, PARTITIONS)]
    assert others
    # Its tombstones would land in the record's partition: another partition's are skipped.
    await forget(rt, WorkflowsForgotten(workflows=[first, *others], ended_before=clock.wall))
    assert first not in table and all(w in table for w in others)


async def test_a_workflow_ended_after_a_held_lease_record_is_kept_while_it_is_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker dying now is redelivered from the oldest record it holds a lease with: a
    workflow that ended later may have its start among what comes again, so it is kept."""
    clock = Clock(monkeypatch)
    rt, table, producer = make(retain_s=1)
    release = asyncio.Event()
    register(rt, release)
    await run(rt, producer, "w-before", 1)
    await rt.handle(Envelope(record=WorkflowStarted(workflow="slow", kind="k"), key="slow",
                             source="/t", seq=1), lambda: None, "tp", 5)  # held from 5
    await run(rt, producer, "w-after", 7)
    clock.advance(5)
    rec = WorkflowsForgotten(workflows=["w-before", "w-after"], ended_before=clock.wall)
    # The test's partitions: one topic-partition "tp" stands for all, so both are checked.
    monkeypatch.setattr(runtime, "partition_of", lambda key, partitions: 0)
    await forget(rt, rec)
    assert "w-before" not in table and "w-after" in table and "slow" in table
    await forget(rt, rec, tp="another tp")  # another partition's lease does not hold it
    assert "w-after" not in table
    release.set()


async def test_a_forgotten_workflow_s_late_records_change_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    rt, table, producer = make(retain_s=1)
    register(rt)
    await run(rt, producer, "w1", 1)
    outcome = next(e for e in producer.sent if e.type == "voice.workflow.step_outcome.v1")
    clock.advance(5)
    [rec] = look(rt, clock)
    await forget(rt, rec)
    sent = len(producer.sent)
    acked: list[str] = []
    await rt.handle(outcome, lambda: acked.append("outcome"), "tp", 20)
    await rt.handle(Envelope(record=LeaseCheck(workflow="w1"), key="w1", source="/t"),
                    lambda: acked.append("probe"), "tp", 21)
    assert table == {} and len(producer.sent) == sent and acked == ["outcome", "probe"]
    # A command to it is refused as to any unknown workflow.
    await rt.handle(Envelope(record=WorkflowCommandReceived(
        workflow="w1", command="resume", command_id="c1", by="staff"), key="w1",
        source="/t", id="cmd-1"), lambda: acked.append("command"), "tp", 22)
    await asyncio.sleep(0)
    answer = producer.sent[-1]
    assert answer.record.outcome == "rejected"  # type: ignore[attr-defined]
    assert "no such workflow" in str(answer.record.detail)  # type: ignore[attr-defined]
    assert table == {} and acked[-1] == "command"
    assert isinstance(outcome.record, StepOutcome)


async def test_a_workflow_stored_before_ended_at_was_kept_counts_from_when_it_was_first_seen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    rt, table, _producer = make(retain_s=100)
    table["legacy"] = {"status": "completed", "settled": True}  # no ended_at, no ended_offset
    assert look(rt, clock) == []
    clock.advance(60)
    assert look(rt, clock) == []
    clock.advance(41)
    [rec] = look(rt, clock)
    assert rec.workflows == ["legacy"]
    await forget(rt, rec)
    assert table == {} and rt._ended_unstamped == {}


async def test_a_look_before_the_tables_are_back_names_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    rt, table, _producer = make(retain_s=1)
    table["old"] = {"status": "completed", "settled": True, "ended_at": 0.0}
    rt.unheld(EVERY, PARTITIONS, ready=False)
    assert rt.forgettable() == []
    clock.advance(1)
    rt.unheld(EVERY - {partition_of("old", PARTITIONS)}, PARTITIONS, ready=True)
    assert rt.forgettable() == [], "a standby copy of another worker's partition"
    rt.unheld(EVERY, PARTITIONS, ready=True)
    assert [r.workflows for r in rt.forgettable()] == [["old"]]


def test_a_record_names_at_most_its_bound_and_at_least_one() -> None:
    with pytest.raises(ValidationError):
        WorkflowsForgotten(workflows=[], ended_before=0)
    with pytest.raises(ValidationError):
        WorkflowsForgotten(workflows=["w"] * (FORGET_AT_MOST + 1), ended_before=0)


async def test_many_ended_workflows_are_named_in_records_of_at_most_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    rt, table, _producer = make(retain_s=1)
    for n in range(4000):
        table[f"w{n}"] = {"status": "completed", "settled": True, "ended_at": 0.0}
    records = look(rt, clock)
    assert all(len(r.workflows) <= FORGET_AT_MOST for r in records)
    assert sorted(w for r in records for w in r.workflows) == sorted(table)
    for rec in records:
        await forget(rt, rec)
    assert table == {}


async def test_a_workflow_s_lock_is_dropped_once_nobody_holds_it() -> None:
    rt, _table, producer = make()
    register(rt)
    for n in range(50):
        await run(rt, producer, f"w{n}", 10 * n)
    assert rt._locks == {}, "one lock a workflow ever run, kept for good"


async def test_a_lock_waited_for_is_kept_until_its_last_holder_leaves() -> None:
    rt, _table, _producer = make()
    order: list[str] = []

    async def hold(name: str, release: asyncio.Event) -> None:
        async with rt._locked("w"):
            order.append(name)
            await release.wait()

    first, second = asyncio.Event(), asyncio.Event()
    a = asyncio.create_task(hold("a", first))
    b = asyncio.create_task(hold("b", second))
    await asyncio.sleep(0)
    assert order == ["a"] and len(rt._locks) == 1
    first.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert order == ["a", "b"] and len(rt._locks) == 1, "b still holds it"
    second.set()
    await asyncio.gather(a, b)
    assert rt._locks == {}
    c = asyncio.create_task(hold("c", asyncio.Event()))
    await asyncio.sleep(0)
    c.cancel()  # cancelled while holding it: let go all the same
    await asyncio.gather(c, return_exceptions=True)
    assert rt._locks == {}
