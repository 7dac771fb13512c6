"""The workflow runtime's lease: the record that started a step stays unacknowledged until the
workflow stops running — including when that record is redelivered after a rebalance."""

from __future__ import annotations

import asyncio
from typing import Any

from consumers.workflows.engine import StepContext, StepDef, WorkflowDef, WorkflowState
from consumers.workflows.runtime import WorkflowRuntime
from schemas.workflow import StepStarted, WorkflowCommandReceived, WorkflowStarted
from streams.envelope import Envelope, decode
from streams.producer import Publisher
from streams.settings import VoiceSettings


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[Envelope] = []

    def produce_raw(self, topic: str, key: bytes, value: bytes, headers: Any) -> Any:
        self.sent.append(decode(key, value, headers))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class Acks:
    def __init__(self) -> None:
        self.done: list[str] = []

    def __call__(self, name: str) -> Any:
        return lambda: self.done.append(name)


def retried_then_next(calls: list[tuple[str, int]]) -> tuple[StepDef, StepDef]:
    """Two steps, each call noted in ``calls``: "a" fails its first attempt, then "b"."""

    async def first(ctx: StepContext) -> dict[str, Any]:
        calls.append((ctx.step, ctx.attempt))
        if ctx.attempt == 1:
            raise RuntimeError("once")
        return {"n": 1}

    async def second(ctx: StepContext) -> dict[str, Any]:
        calls.append((ctx.step, ctx.attempt))
        return {"n": 2}

    return StepDef("a", first), StepDef("b", second)


async def test_a_redelivered_lease_record_is_never_acknowledged_twice() -> None:
    release = asyncio.Event()

    async def step(ctx: StepContext) -> dict[str, Any]:
        await release.wait()
        return {"ok": True}

    producer = FakeProducer()
    rt = WorkflowRuntime(VoiceSettings(), {}, Publisher(VoiceSettings(), lambda: producer))  # type: ignore[arg-type, return-value]
    rt.register(WorkflowDef("k", (StepDef("s", step),)))
    acks = Acks()
    started = Envelope(record=WorkflowStarted(workflow="w1", kind="k"), key="w1",
                       source="/t", seq=1)
    await rt.handle(started, acks("first delivery"), "tp0", 5)
    await asyncio.sleep(0)
    assert "w1" in rt.tasks and acks.done == []
    # A rebalance kept the partition here: the same record comes again while the step runs.
    await rt.handle(started, acks("redelivery"), "tp0", 5)
    assert acks.done == [], "acknowledging either delivery would commit past the lease"
    # A later record of the running workflow is acknowledged; the lease stays where it was.
    later = Envelope(record=StepStarted(workflow="w1", step="s", attempt=1), key="w1",
                     source="/t", seq=2)
    await rt.handle(later, acks("later"), "tp0", 6)
    assert acks.done == ["later"]
    release.set()
    for _ in range(20):
        await asyncio.sleep(0)
    outcome = next(e for e in producer.sent if e.type == "voice.workflow.step_outcome.v1")
    await rt.handle(outcome, acks("outcome"), "tp0", 9)
    # The workflow ended: the lease (its latest delivery) and the outcome are acknowledged.
    assert acks.done == ["later", "redelivery", "outcome"]
    assert [e.type for e in producer.sent][-1] == "voice.workflow.completed.v2"


async def test_a_workflow_writes_the_fewest_lifecycle_records_and_readers_see_them_all() -> None:
    """Issue 14: a last step's success is the workflow's end (one ``LastStepSucceeded``); every
    step's attempt, the first included, still gets its ``StepStarted`` (after a hand-over it is
    what wakes the next owner of a step whose worker left). The seqs stay dense, and the
    staff view, the replay's fold and ``step_success`` read the new shapes as the old."""
    from api.staff.views import Workflows
    from deploy.rerun_steps import succeeded_steps
    from schemas.workflow import LastStepSucceeded, StepFailed, WorkflowFailed, step_success

    calls: list[tuple[str, int]] = []
    producer = FakeProducer()
    table: dict[str, Any] = {}
    rt = WorkflowRuntime(VoiceSettings(), table, Publisher(VoiceSettings(), lambda: producer))  # type: ignore[arg-type, return-value]
    wf = WorkflowDef("k", retried_then_next(calls))
    rt.register(wf)
    started = Envelope(record=WorkflowStarted(workflow="w1", kind="k"), key="w1",
                       source="/t", seq=1, id="w1:1")
    await rt.handle(started, lambda: None, "tp0", 1)
    assert table["w1"]["status"] == "running"
    assert [type(e.record).__name__ for e in producer.sent] == ["StepStarted"], \
        "a start writes its first step's StepStarted (the next owner's wake-up after a hand-over)"
    handled = 0
    for _ in range(200):
        await asyncio.sleep(0)
        outcomes = [e for e in producer.sent if e.type.endswith("step_outcome.v1")]
        for outcome in outcomes[handled:]:
            await rt.handle(outcome, lambda: None, "tp0", 2)
        handled = len(outcomes)
        if table["w1"]["status"] != "running":
            break
    lifecycle = [e for e in producer.sent if not e.type.endswith("step_outcome.v1")]
    assert [(type(e.record).__name__, getattr(e.record, "attempt", None)) for e in lifecycle] \
        == [("StepStarted", 1), ("StepFailed", 1), ("StepStarted", 2), ("StepSucceeded", 2),
            ("StepStarted", 1), ("LastStepSucceeded", 1)]
    assert [e.seq for e in lifecycle] == [2, 3, 4, 5, 6, 7], "dense after WorkflowStarted's 1"
    assert calls == [("a", 1), ("a", 2), ("b", 1)]
    last = lifecycle[-1].record
    assert isinstance(last, LastStepSucceeded) and last.output == {"n": 2}
    assert step_success(last) is not None and step_success(last).step == "b"  # type: ignore[union-attr]
    view = Workflows()
    for env in [started, *lifecycle]:
        view.apply(env)
    w = view.by_key["w1"]
    assert (w.status, w.step, w.outputs) == ("completed", "b", {"a": {"n": 1}, "b": {"n": 2}})
    # A workflow failing on its first step's first attempt (no StepStarted) names the step.
    failed = Workflows()
    for seq, rec in enumerate((
            WorkflowStarted(workflow="w2", kind="k"),
            StepFailed(workflow="w2", step="a", attempt=1, error_type="DEADLINE_EXCEEDED",
                       retryable=False),
            WorkflowFailed(workflow="w2", step="a", attempts=1,
                           error_type="DEADLINE_EXCEEDED")), start=1):
        failed.apply(Envelope(record=rec, key="w2", source="/t", seq=seq))
    assert (failed.by_key["w2"].status, failed.by_key["w2"].step) == ("failed", "a")
    ran = succeeded_steps(wf, [started, *producer.sent], 3)
    assert [(r.index, r.ctx.attempt, r.output) for r in ran] == [(0, 2, {"n": 1}),
                                                                 (1, 1, {"n": 2})]


def test_unheld_running_workflows_of_our_partitions_are_probed_once_in_a_while() -> None:
    from consumers.workflows.runtime import partition_of

    table = {"w-run": {"status": "running"}, "w-done": {"status": "completed"},
             "w-held": {"status": "running"}}
    rt = WorkflowRuntime(VoiceSettings(), table, Publisher(VoiceSettings(), FakeProducer))  # type: ignore[arg-type]
    rt.tasks["w-held"] = None  # type: ignore[assignment]  (a step runs here)
    mine = {partition_of("w-run", 6)}
    assert rt.unheld(mine, 6) == ["w-run"]
    assert rt.unheld(mine, 6) == [], "not probed again at once"
    others = set(range(6)) - mine
    rt2 = WorkflowRuntime(VoiceSettings(), table, Publisher(VoiceSettings(), FakeProducer))  # type: ignore[arg-type]
    assert "w-run" not in rt2.unheld(others, 6), "a standby copy of another's partition"


async def test_a_workflow_carries_its_tenant_and_ignores_another_tenants_commands() -> None:
    async def step(ctx: StepContext) -> dict[str, Any]:
        raise RuntimeError("always")

    producer = FakeProducer()
    settings = VoiceSettings(step_attempts=1)
    table: dict[str, Any] = {}
    rt = WorkflowRuntime(settings, table, Publisher(settings, lambda: producer))  # type: ignore[arg-type, return-value]
    rt.register(WorkflowDef("k", (StepDef("s", step),)))
    started = Envelope(record=WorkflowStarted(workflow="w1", kind="k"), key="w1",
                       source="/t", seq=1, tenant="t1")
    await rt.handle(started, lambda: None, "tp0", 1)
    for _ in range(20):
        await asyncio.sleep(0)
    outcome = next(e for e in producer.sent if e.type == "voice.workflow.step_outcome.v1")
    await rt.handle(outcome, lambda: None, "tp0", 2)
    assert table["w1"]["status"] == "failed" and table["w1"]["tenant"] == "t1"
    assert {e.tenant for e in producer.sent} == {"t1"}  # every record it wrote carries it

    def retry(tenant: str, id_: str) -> Envelope:
        return Envelope(record=WorkflowCommandReceived(workflow="w1", command="retry",
                                                       command_id=id_, by="op"),
                        key="w1", source="/t", tenant=tenant, id=id_)

    sent = len(producer.sent)
    await rt.handle(retry("t2", "r-forged"), lambda: None, "tp0", 3)
    await asyncio.sleep(0)
    # Only an answer, as for a workflow that does not exist; nothing of the workflow moved.
    [answer] = [e.record for e in producer.sent[sent:]]
    assert (answer.outcome, answer.detail["reason"]) == ("rejected", "no such workflow 'w1'")
    assert table["w1"]["status"] == "failed"
    await rt.handle(retry("t1", "r-own"), lambda: None, "tp0", 4)
    assert table["w1"]["status"] == "running"


async def test_a_handover_releases_the_leases_and_keeps_only_the_steps_of_our_partitions(
        ) -> None:
    """Before a handover the held records are acknowledged (so Faust can wait for the records
    in flight and flush the table, fault 4); the steps run on, and after the rebalance only
    those of partitions still ours keep running."""
    from faust.types import TP

    from consumers.workflows.runtime import partition_of

    release = asyncio.Event()

    async def step(ctx: StepContext) -> dict[str, Any]:
        await release.wait()
        return {"ok": True}

    settings = VoiceSettings(topic_partitions=3)
    producer = FakeProducer()
    rt = WorkflowRuntime(settings, {}, Publisher(settings, lambda: producer))  # type: ignore[arg-type, return-value]
    rt.register(WorkflowDef("k", (StepDef("s", step),)))
    acks = Acks()
    # Two workflows on two different partitions.
    names = iter(f"w{n}" for n in range(100))
    ours = next(w for w in names if partition_of(w, 3) == 0)
    theirs = next(w for w in names if partition_of(w, 3) == 1)
    for offset, w in enumerate((ours, theirs)):
        await rt.handle(Envelope(record=WorkflowStarted(workflow=w, kind="k"), key=w,
                                 source="/t", seq=1), acks(w), f"tp{partition_of(w, 3)}",
                        offset)
    await asyncio.sleep(0)
    assert acks.done == [] and set(rt.tasks) == {ours, theirs}

    rt.release_leases()
    assert sorted(acks.done) == sorted([ours, theirs]), "every held record acknowledged"
    assert set(rt.tasks) == {ours, theirs}, "the steps run on through the handover"
    # A record in flight during the handover that starts a step holds nothing either (the
    # handover waits for every record in flight to be acknowledged).
    late = next(w for w in names if partition_of(w, 3) == 0)
    await rt.handle(Envelope(record=WorkflowStarted(workflow=late, kind="k"), key=late,
                             source="/t", seq=1), acks(late), "tp0", 7)
    assert acks.done[-1] == late and late in rt.tasks

    theirs_task = rt.tasks[theirs]
    rt.keep_only({TP(rt.topic, 0), TP("t.voice.commands", 1)})
    await asyncio.sleep(0)
    assert set(rt.tasks) == {ours, late} and theirs_task.cancelled()
    release.set()
    for _ in range(20):
        await asyncio.sleep(0)
    outcome = next(e for e in producer.sent
                   if e.type == "voice.workflow.step_outcome.v1" and e.key == ours)
    await rt.handle(outcome, acks("outcome"), "tp0", 9)
    assert acks.done[-1] == "outcome" and ours not in rt.tasks
    assert [e.type for e in producer.sent][-1] == "voice.workflow.completed.v2"


class CountingTable(dict):
    """A table that counts its writes (each one a changelog record)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, bool]] = []

    def __setitem__(self, key: str, value: Any) -> None:
        self.writes.append((value["status"], value["settled"]))
        super().__setitem__(key, value)


async def _run_to_end(wf_fails: bool, on_end_when: tuple[Any, ...]
                      ) -> tuple[CountingTable, list[str]]:
    ended: list[str] = []

    async def step(ctx: StepContext) -> dict[str, Any]:
        if wf_fails:
            raise RuntimeError("no")
        return {}

    async def on_end(state: Any) -> None:
        ended.append(state.status)

    producer, table = FakeProducer(), CountingTable()
    settings = VoiceSettings(step_attempts=1)
    rt = WorkflowRuntime(settings, table, Publisher(settings, lambda: producer))  # type: ignore[arg-type, return-value]
    rt.register(WorkflowDef("k", (StepDef("s", step),), on_end=on_end, on_end_when=on_end_when))
    await rt.handle(Envelope(record=WorkflowStarted(workflow="w1", kind="k"), key="w1",
                             source="/t", seq=1), lambda: None, "tp0", 1)
    for _ in range(50):
        await asyncio.sleep(0)
        outcome = next((e for e in producer.sent
                        if e.type == "voice.workflow.step_outcome.v1"), None)
        if outcome is not None:
            break
    assert outcome is not None
    await rt.handle(outcome, lambda: None, "tp0", 2)
    return table, ended


async def test_an_end_its_on_end_does_not_act_on_is_settled_in_one_table_write() -> None:
    """A turn that completed recorded its end in its step: its workflow is settled with its
    end (one changelog record), while a failed one still waits for its bookkeeping."""
    table, ended = await _run_to_end(False, ("failed",))
    assert table.writes == [("running", True), ("completed", True)] and ended == []
    table, ended = await _run_to_end(True, ("failed",))
    assert table.writes == [("running", True), ("failed", False), ("failed", True)]
    assert ended == ["failed"]
    table, ended = await _run_to_end(False, ("completed", "failed"))  # the default
    assert table.writes == [("running", True), ("completed", False), ("completed", True)]
    assert ended == ["completed"]


class LookedAt(dict):  # type: ignore[type-arg]
    """A table that counts how often all of it, and each value, is looked at."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.walks = 0
        self.gets: list[str] = []

    def items(self) -> Any:
        self.walks += 1
        return super().items()

    def get(self, key: Any, default: Any = None) -> Any:
        self.gets.append(key)
        return super().get(key, default)


def test_between_looks_at_every_workflow_only_the_unfinished_are_looked_at(
        monkeypatch: Any) -> None:
    """Ended workflows stay in the table for days: the lease check looks at all of them only
    when the active partitions or the tables' readiness changed, or ``FULL_LOOK_S`` passed;
    otherwise at those last seen running or unsettled (and those it wrote so itself)."""
    from consumers.workflows import runtime

    table = LookedAt({f"w-done-{n}": {"status": "completed", "settled": True}
                      for n in range(1000)})
    table["w-run"] = {"status": "running"}
    rt = WorkflowRuntime(VoiceSettings(), table, Publisher(VoiceSettings(), FakeProducer))  # type: ignore[arg-type]
    everything = set(range(6))
    assert rt.unheld(everything, 6) == ["w-run"]
    assert table.walks == 1
    table.gets.clear()
    assert rt.unheld(everything, 6) == [], "probed a moment ago"
    assert table.walks == 1 and table.gets == ["w-run"], "only the unfinished one"
    # A workflow another worker ran, restored from the changelog meanwhile: found once what
    # the table may hold has changed (readiness, partitions) or the full look is due.
    table["w-restored"] = {"status": "failed", "settled": False}
    assert rt.unheld(everything, 6) == []
    assert rt.unheld(everything, 6, ready=False) == ["w-restored"] and table.walks == 2
    table["w-restored-2"] = {"status": "running"}
    assert rt.unheld(everything - {0}, 6, ready=False) in ([], ["w-restored-2"])
    assert table.walks == 3
    rt.unheld(everything, 6)
    assert table.walks == 4
    table["w-restored-3"] = {"status": "running"}
    assert rt.unheld(everything, 6) == [] and table.walks == 4
    monkeypatch.setattr(runtime, "FULL_LOOK_S", 0.0)
    assert rt.unheld(everything, 6) == ["w-restored-3"] and table.walks == 5
    # What it writes itself is looked at without a full look: ended and settled, never again.
    monkeypatch.setattr(runtime, "FULL_LOOK_S", 3600.0)
    state = WorkflowState(workflow="w-mine", kind="k", input={})
    rt._write(state)
    assert rt.unheld(everything, 6) == ["w-mine"] and table.walks == 5
    state.status, state.settled = "completed", True
    rt._write(state)
    table.gets.clear()
    assert rt.unheld(everything, 6) == [] and "w-mine" not in table.gets
    assert table.walks == 5
