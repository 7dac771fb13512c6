"""Issue 14: the workflow runtime's agent reads back the lifecycle records its own runtime
wrote (a turn's ``StepStarted`` and ``LastStepSucceeded``) and acknowledges them unread —
only those that ``handle`` would acknowledge and do nothing else with."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from consumers.frame.failures import RecordGuard, consume
from consumers.frame.writer import Raw
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef
from consumers.workflows.runtime import WorkflowRuntime
from schemas.workflow import LastStepSucceeded, WorkflowStarted
from streams.envelope import Envelope, decode, encode
from streams.producer import Publisher
from streams.retry import RetryPolicy
from streams.settings import VoiceSettings


class Landed:
    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


class PartitionLog:
    """A producer whose records land on one partition, in order, and can be read back."""

    def __init__(self) -> None:
        self.log: list[tuple[bytes, bytes, Any]] = []

    def produce_raw(self, topic: str, key: bytes, value: bytes, headers: Any) -> Any:
        self.log.append((key, value, headers))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(Landed(0, len(self.log) - 1))
        return fut

    def raw(self, offset: int) -> Raw:
        key, value, headers = self.log[offset]
        return Raw("voice.workflows", 0, offset, key, value, headers)


def _runtime(steps: tuple[StepDef, ...], on_end: Any = None) -> tuple[WorkflowRuntime,
                                                                       PartitionLog,
                                                                       dict[str, Any]]:
    log, table = PartitionLog(), {}
    rt = WorkflowRuntime(VoiceSettings(), table, Publisher(VoiceSettings(), lambda: log))  # type: ignore[arg-type, return-value]
    rt.register(WorkflowDef("k", steps, on_end=on_end))
    return rt, log, table


async def _settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


async def _read_back(rt: WorkflowRuntime, log: PartitionLog, table: dict[str, Any],
                     offset: int) -> tuple[bool, list[str]]:
    """What the agent sees at ``offset``: whether it is skipped; then ``handle`` of the same
    record, which must only acknowledge a skipped one (same table, nothing written)."""
    raw = log.raw(offset)
    skipped = rt.already_applied(raw)
    before, written = copy.deepcopy(table), len(log.log)
    acked: list[str] = []
    await rt.handle(decode(raw.key, raw.value, raw.headers), lambda: acked.append("ack"),
                    "tp0", offset)
    if skipped:
        assert acked == ["ack"] and table == before and len(log.log) == written, \
            f"offset {offset} was skipped, but handle did more than acknowledge it"
    return skipped, acked


def _start(log: PartitionLog, workflow: str = "w1") -> int:
    key, value, headers = encode(Envelope(record=WorkflowStarted(workflow=workflow, kind="k"),
                                          key=workflow, source="/t", seq=1, id=f"{workflow}:1"))
    log.log.append((key, value, headers))
    return len(log.log) - 1


async def test_a_turns_own_records_are_skipped_and_its_inputs_are_not() -> None:
    release = asyncio.Event()

    async def step(ctx: StepContext) -> dict[str, Any]:
        await release.wait()
        return {"ok": True}

    rt, log, table = _runtime((StepDef("s", step),))
    started = _start(log)
    assert not rt.already_applied(log.raw(started)), "a start is an input"
    await rt.handle(decode(*log.log[started]), lambda: None, "tp0", started)
    step_started = started + 1
    assert "w1" in rt.tasks and len(log.log) == step_started + 1
    # Its StepStarted read back while the step runs: skipped, as handle only acknowledges it.
    assert (await _read_back(rt, log, table, step_started))[0]
    release.set()
    await _settle()
    outcome = step_started + 1
    assert decode(*log.log[outcome]).type == "voice.workflow.step_outcome.v1"
    assert not rt.already_applied(log.raw(outcome)), "an outcome is an input"
    await rt.handle(decode(*log.log[outcome]), lambda: None, "tp0", outcome)
    last = outcome + 1
    assert table["w1"]["status"] == "completed" and table["w1"]["settled"]
    # The LastStepSucceeded read back: the workflow ended and settled, nothing to do.
    assert (await _read_back(rt, log, table, last))[0]
    # Read a second time (a redelivery): no longer taken for one of ours.
    assert not rt.already_applied(log.raw(last))


async def test_a_retried_steps_records_are_skipped_while_its_next_attempt_runs() -> None:
    attempts: list[int] = []
    release = asyncio.Event()

    async def step(ctx: StepContext) -> dict[str, Any]:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        await release.wait()
        return {}

    rt, log, table = _runtime((StepDef("s", step),))
    started = _start(log)
    await rt.handle(decode(*log.log[started]), lambda: None, "tp0", started)
    await _settle()
    outcome = len(log.log) - 1
    await rt.handle(decode(*log.log[outcome]), lambda: None, "tp0", outcome)
    await _settle()
    assert attempts == [1, 2]
    types = [decode(*r).type.split(".")[-2] for r in log.log]
    assert types[:5] == ["started", "step_started", "step_outcome", "step_failed",
                         "step_started"], types
    for offset in (1, 3, 4):  # the first StepStarted, the StepFailed, the second StepStarted
        assert (await _read_back(rt, log, table, offset))[0], offset
    release.set()


async def test_after_a_rebalance_nothing_is_taken_for_ours() -> None:
    """A record read after a rebalance may be what wakes a step its worker left: handled."""
    release = asyncio.Event()

    async def step(ctx: StepContext) -> dict[str, Any]:
        await release.wait()
        return {}

    async def quick(ctx: StepContext) -> dict[str, Any]:
        return {}

    rt, log, table = _runtime((StepDef("s", step),))
    rt.register(WorkflowDef("quick", (StepDef("q", quick),)))
    # w2 ends before the rebalance; its last record is not read back yet.
    key, value, headers = encode(Envelope(record=WorkflowStarted(workflow="w2", kind="quick"),
                                          key="w2", source="/t", seq=1, id="w2:1"))
    log.log.append((key, value, headers))
    await rt.handle(decode(key, value, headers), lambda: None, "tp0", 0)
    await _settle()
    outcome = len(log.log) - 1
    await rt.handle(decode(*log.log[outcome]), lambda: None, "tp0", outcome)
    w2_last = len(log.log) - 1
    assert table["w2"]["settled"]
    assert isinstance(decode(*log.log[w2_last]).record, LastStepSucceeded)
    started = _start(log)
    await rt.handle(decode(*log.log[started]), lambda: None, "tp0", started)
    rt.release_leases()
    # From here the table may change under the runtime (the partition's next owner): none of
    # what it wrote before counts as its own any more, ended workflows' records included.
    assert not rt.already_applied(log.raw(w2_last))
    # A start handled while the partitions are handed over writes its StepStarted then.
    w3 = _start(log, "w3")
    await rt.handle(decode(*log.log[w3]), lambda: None, "tp0", w3)
    rt.keep_only(set())  # the partition went elsewhere: its steps stopped here
    assert not rt.already_applied(log.raw(w3 + 1))
    await _settle()
    assert "w1" not in rt.tasks
    assert not rt.already_applied(log.raw(started + 1))
    # The partition came back: the StepStarted finds the workflow running with no task and
    # runs its step again (worker_lost), which a skip would have lost.
    skipped, acked = await _read_back(rt, log, table, started + 1)
    assert not skipped and "w1" in rt.tasks and table["w1"]["attempt"] == 2
    release.set()


async def test_an_end_left_unsettled_is_not_skipped() -> None:
    ends: list[str] = []

    async def on_end(state: Any) -> None:
        ends.append(state.status)
        if len(ends) == 1:
            raise RuntimeError("on_end failed once")

    async def step(ctx: StepContext) -> dict[str, Any]:
        raise RuntimeError("always fails")

    rt, log, table = _runtime((StepDef("s", step),), on_end=on_end)
    rt.settings.step_attempts = 1
    started = _start(log)
    await rt.handle(decode(*log.log[started]), lambda: None, "tp0", started)
    await _settle()
    outcome = len(log.log) - 1
    try:
        await rt.handle(decode(*log.log[outcome]), lambda: None, "tp0", outcome)
    except RuntimeError:
        pass  # the agent retries the record; here the failed end stays unsettled
    assert table["w1"]["status"] == "failed" and not table["w1"]["settled"]
    failed = len(log.log) - 1
    skipped, _ = await _read_back(rt, log, table, failed)
    assert not skipped and ends == ["failed", "failed"] and table["w1"]["settled"]


class Event:
    def __init__(self, offset: int, key: bytes) -> None:
        self.message = type("M", (), {"partition": 0, "offset": offset, "key": key,
                                      "value": b"{}", "headers": []})()
        self.acked = False

    def ack(self) -> None:
        self.acked = True


async def test_consume_acknowledges_a_skipped_record_unread() -> None:
    handled: list[int] = []

    async def events() -> Any:
        for offset, key in enumerate([b"a", b"skip", b"b"]):
            yield Event(offset, key)

    async def dispatch(raw: Raw, event: Any) -> None:
        handled.append(raw.offset or 0)

    seen: list[Event] = []

    async def keep(source: Any) -> Any:
        async for e in source:
            seen.append(e)
            yield e

    guard = RecordGuard("t", lambda: None, RetryPolicy(attempts=1))  # type: ignore[arg-type, return-value]
    await consume(keep(events()), "t", guard, dispatch, True, halt=lambda exc: asyncio.sleep(0),
                  skip=lambda raw: raw.key == b"skip")
    assert handled == [0, 2]
    assert [e.acked for e in seen] == [False, True, False], \
        "manual ack: handled records are the handler's to acknowledge, the skipped one is acked"


def test_an_agent_with_lanes_skips_nothing() -> None:
    import pytest

    async def nothing() -> Any:
        if False:
            yield None

    guard = RecordGuard("t", lambda: None, RetryPolicy(attempts=1))  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="skips nothing"):
        asyncio.run(consume(nothing(), "t", guard, lambda r, e: asyncio.sleep(0), False,
                            halt=lambda exc: asyncio.sleep(0), lane=lambda r: r.key,
                            skip=lambda r: True))


def test_the_delivery_watch_reads_only_deliveries() -> None:
    from consumers.staff.delivery import of_a_delivery

    assert of_a_delivery(b"iss-0123abcd:dev-3")
    assert not of_a_delivery(b"cnv-1:turn-2:1")
    assert not of_a_delivery(None)
    assert not of_a_delivery(b"\xff\xfe")
