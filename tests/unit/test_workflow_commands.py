"""A workflow's commands are decided by the workflow and answered: accepted, or refused with
the reason — a double click, a reviewer arriving while the workflow is between two states, a
burst of commands, a retry of a workflow that has not failed (issue 12 §6). Through the real
runtime, with the review workflow's own rules and a fake producer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from consumers.staff.review import answers, refuse
from consumers.workflows.commands import MAX_QUEUED
from consumers.workflows.engine import Pause, StepContext, StepDef, WorkflowDef
from consumers.workflows.runtime import WorkflowRuntime
from schemas.system import CommandAcknowledged
from schemas.workflow import StepOutcome, WorkflowCommandReceived, WorkflowStarted
from streams.envelope import Envelope
from streams.producer import Publisher
from streams.settings import VoiceSettings
from tests.unit.test_workflow_runtime import FakeProducer

WF = "ctb-1"


def review_like(flags: int, fail_publish: list[bool] | None = None) -> WorkflowDef:
    """The disclosure review's shape and rules, without its I/O."""

    async def flag(ctx: StepContext) -> dict[str, Any]:
        return {"flag_count": flags}

    async def review(ctx: StepContext) -> dict[str, Any] | Pause:
        cmd = ctx.commands.get("review")
        return Pause("review") if cmd is None else {"by": cmd["by"]}

    async def second(ctx: StepContext) -> dict[str, Any] | Pause:
        if not ctx.outputs["flag"]["flag_count"]:
            return {"skipped": True}
        cmd = ctx.commands.get("second_review")
        return Pause("second_review") if cmd is None else {"by": cmd["by"]}

    async def publish(ctx: StepContext) -> dict[str, Any]:
        if fail_publish and fail_publish.pop(0):
            raise RuntimeError("publish failed")
        return {"state": "published"}

    return WorkflowDef("disclosure-review", (
        StepDef("flag", flag), StepDef("review", review), StepDef("second_review", second),
        StepDef("publish", publish)), answers=answers, refuse=refuse)


class World:
    """One runtime, its table, and the records it produced; ``settle`` feeds the steps'
    outcomes back as the log would."""

    def __init__(self, definition: WorkflowDef, attempts: int = 3) -> None:
        self.producer = FakeProducer()
        settings = VoiceSettings(step_attempts=attempts)
        self.table: dict[str, Any] = {}
        self.rt = WorkflowRuntime(settings, self.table,
                                  Publisher(settings, lambda: self.producer))  # type: ignore[arg-type, return-value]
        self.rt.register(definition)
        self.fed = 0
        self.offset = 0

    async def handle(self, env: Envelope) -> None:
        self.offset += 1
        await self.rt.handle(env, lambda: None, "tp0", self.offset)

    async def start(self) -> None:
        await self.handle(Envelope(record=WorkflowStarted(workflow=WF, kind="disclosure-review"),
                                   key=WF, source="/t", seq=1, tenant="t1", id=f"{WF}:1"))
        await self.settle()

    async def settle(self) -> None:
        """Run the steps until none is running (each outcome applied in order)."""
        for _ in range(200):
            await asyncio.sleep(0)
            outcomes = [e for e in self.producer.sent[self.fed:]
                        if isinstance(e.record, StepOutcome)]
            self.fed = len(self.producer.sent)
            for env in outcomes:
                await self.handle(env)
            if not outcomes and not self.rt.tasks:
                return

    async def send(self, command: str, by: str, command_id: str, envelope_id: str,
                   tenant: str = "t1") -> None:
        await self.handle(Envelope(
            record=WorkflowCommandReceived(workflow=WF, command=command, command_id=command_id,
                                           by=by, payload={"decision": "approve"}),
            key=WF, source="/t", tenant=tenant, id=envelope_id))

    def answers(self) -> dict[str, CommandAcknowledged]:
        """Every answer so far, by the id of the record that carried the command."""
        return {e.key: e.record for e in self.producer.sent
                if isinstance(e.record, CommandAcknowledged)}

    def status(self) -> tuple[str, str | None]:
        return self.table[WF]["status"], self.table[WF]["waiting_for"]

    def count(self, kind: str) -> int:
        return sum(type(e.record).__name__ == kind for e in self.producer.sent)


async def test_a_double_click_is_one_review_the_other_refused_with_the_reason() -> None:
    w = World(review_like(flags=1))
    await w.start()
    assert w.status() == ("paused", "review")
    # Two clicks at once (two idempotency keys): the second arrives while the first runs on.
    await w.send("review", "rev1", "k1", "e1")
    await w.send("review", "rev1", "k2", "e2")
    assert "e2" not in w.answers(), "between two states the workflow decides later, not now"
    await w.settle()
    a = w.answers()
    assert (a["e1"].outcome, a["e1"].detail["command"]) == ("accepted", "review")
    assert a["e2"].outcome == "rejected"
    assert "second review must come from a different reviewer" in a["e2"].detail["reason"]
    assert w.status() == ("paused", "second_review") and w.count("WorkflowResumed") == 1


async def test_a_second_reviewer_arriving_between_states_is_decided_not_turned_away() -> None:
    w = World(review_like(flags=1))
    await w.start()
    await w.send("review", "rev1", "k1", "e1")
    await w.send("review", "rev2", "k2", "e2")  # the workflow is between review and second
    await w.settle()
    a = w.answers()
    assert a["e1"].outcome == a["e2"].outcome == "accepted"
    assert a["e2"].detail["command"] == "second_review"
    assert w.status() == ("completed", None)
    # A late third review: refused, saying why.
    await w.send("review", "rev3", "k3", "e3")
    assert w.answers()["e3"].outcome == "rejected"
    assert "completed" in w.answers()["e3"].detail["reason"]


async def test_a_second_click_on_an_unflagged_contribution_is_refused_as_completed() -> None:
    w = World(review_like(flags=0))
    await w.start()
    await w.send("review", "rev1", "k1", "e1")
    await w.send("review", "rev2", "k2", "e2")
    await w.settle()
    a = w.answers()
    assert a["e1"].outcome == "accepted" and a["e2"].outcome == "rejected"
    assert "not waiting for a command: it has completed" in a["e2"].detail["reason"]


async def test_the_same_command_again_gets_the_same_answer_and_resumes_once() -> None:
    w = World(review_like(flags=1))
    await w.start()
    await w.send("review", "rev1", "k1", "e1")
    await w.send("review", "rev1", "k1", "e1-again")  # queued-time repeat: answered with it
    await w.settle()
    await w.send("review", "rev1", "k1", "e1-later")  # decided-time repeat
    a = w.answers()
    assert a["e1"].outcome == "accepted"
    assert (a["e1-again"].outcome, a["e1-later"].outcome) == ("duplicate", "duplicate")
    assert a["e1-later"].detail == a["e1"].detail and a["e1-later"].seq == a["e1"].seq
    assert w.count("WorkflowResumed") == 1
    # A refused command sent again is refused again (never turned into a 202).
    await w.send("review", "rev1", "k9", "e9")
    await w.send("review", "rev1", "k9", "e9-again")
    assert w.answers()["e9"].outcome == w.answers()["e9-again"].outcome == "rejected"


async def test_a_hostile_burst_is_answered_in_full_and_the_state_stays_small() -> None:
    w = World(review_like(flags=1))
    await w.start()
    await w.send("review", "rev1", "first", "e0")
    for n in range(1, 300):  # all while the workflow runs on from the first review
        await w.send("review", f"x{n}", f"k{n}", f"e{n}")
    queued = len(w.table[WF]["queued"])
    assert queued == MAX_QUEUED, "a running workflow holds only a few commands"
    early = w.answers()
    refused_now = [i for i in early if i != "e0" and early[i].outcome == "rejected"]
    assert len(refused_now) == 299 - MAX_QUEUED
    assert all(early[i].detail.get("retryable") for i in refused_now)
    await w.settle()
    a = w.answers()
    assert len(a) == 300, "every command answered"
    assert sorted(i for i in a if a[i].outcome == "accepted") == ["e0", "e1"]
    assert w.count("WorkflowResumed") == 2 and w.status() == ("completed", None)
    # After many more, the workflow's table value is still small.
    for n in range(300, 800):
        await w.send("review", f"x{n}", f"k{n}", f"e{n}")
    assert len(json.dumps(w.table[WF])) < 64 * 1024


async def test_a_retry_is_decided_only_for_a_failed_workflow() -> None:
    w = World(review_like(flags=0, fail_publish=[True, False]), attempts=1)
    await w.start()
    await w.send("retry", "op", f"{WF}:retry:3", "r-early")
    assert w.answers()["r-early"].outcome == "rejected"
    assert "paused, not failed" in w.answers()["r-early"].detail["reason"]
    await w.send("review", "rev1", "k1", "e1")
    await w.settle()
    assert w.status() == ("failed", None)
    await w.send("retry", "op", f"{WF}:retry:9", "r1")
    await w.send("retry", "op", f"{WF}:retry:9", "r1-again")  # the same click, again
    await w.send("retry", "op", f"{WF}:retry:10", "r2")  # another: it is running again
    await w.settle()
    a = w.answers()
    assert (a["r1"].outcome, a["r1-again"].outcome) == ("accepted", "duplicate")
    assert a["r2"].outcome == "rejected" and "not failed" in a["r2"].detail["reason"]
    assert w.status() == ("completed", None) and w.count("WorkflowResumed") == 2


async def test_a_command_of_another_tenant_or_for_no_workflow_is_answered_no_such() -> None:
    w = World(review_like(flags=0))
    await w.start()
    await w.send("review", "rev1", "k1", "forged", tenant="t2")
    answer = w.answers()["forged"]
    assert answer.outcome == "rejected" and answer.detail["reason"].startswith("no such")
    assert w.status() == ("paused", "review")
