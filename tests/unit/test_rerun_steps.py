"""Folding a recorded workflow lifecycle for replay: each succeeded step gets the context the
runtime gave it — the attempt after a failure or a lost worker, earlier outputs, the commands
that resumed it — and nothing else; and a step whose re-run differs is reported."""

from __future__ import annotations

import asyncio
from typing import Any

from consumers.workflows.engine import Pause, StepContext, StepDef, WorkflowDef
from deploy.histories import Recorded, RecordedLog
from deploy.rerun_steps import differing, rerun_steps, succeeded_steps
from schemas.workflow import StepOutcome, WorkflowCommandReceived, WorkflowStarted
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings


async def _unused(ctx: StepContext) -> dict[str, Any]:
    raise AssertionError("the fold runs no step")


WF = WorkflowDef("two-steps", (StepDef("first", _unused), StepDef("second", _unused)))


def env(record: Any) -> Envelope:
    return Envelope(record=record, key="wf-1", source="/test")


def outcome(index: int, attempt: int, status: str = "succeeded", **kw: Any) -> Envelope:
    return env(StepOutcome(workflow="wf-1", step=WF.step(index).name, step_index=index,
                           attempt=attempt, status=status, **kw))  # type: ignore[arg-type]


START = env(WorkflowStarted(workflow="wf-1", kind="two-steps", input={"n": 1}))


def test_a_step_retried_after_a_failure_runs_with_its_later_attempt() -> None:
    ran = succeeded_steps(WF, [
        START, outcome(0, 1, "failed", error="boom", error_type="Boom"),
        outcome(0, 2, output={"a": 1}), outcome(1, 1, output={"b": 2})], max_attempts=3)
    assert [(r.ctx.step, r.ctx.attempt, r.output) for r in ran] == [
        ("first", 2, {"a": 1}), ("second", 1, {"b": 2})]
    assert ran[1].ctx.outputs == {"first": {"a": 1}} and ran[1].ctx.input == {"n": 1}


def test_a_step_whose_worker_died_is_seen_with_the_attempt_that_succeeded() -> None:
    ran = succeeded_steps(WF, [START, outcome(0, 2, output={"a": 1})], max_attempts=3)
    assert [(r.ctx.step, r.ctx.attempt) for r in ran] == [("first", 2)]


def test_a_superseded_outcome_and_a_redelivered_start_change_nothing() -> None:
    ran = succeeded_steps(WF, [START, outcome(0, 1, output={"a": 1}), START,
                               outcome(0, 1, output={"a": "late"}),
                               outcome(1, 1, output={"b": 2})], max_attempts=3)
    assert [r.output for r in ran] == [{"a": 1}, {"b": 2}]


def test_a_step_resumed_by_a_command_sees_it() -> None:
    ran = succeeded_steps(WF, [
        START, outcome(0, 1, output={}), outcome(1, 1, "paused", waiting_for="second"),
        env(WorkflowCommandReceived(workflow="wf-1", command="second", command_id="c1",
                                    by="rev1", payload={"decision": "approve"})),
        outcome(1, 1, output={"done": True})], max_attempts=3)
    assert ran[-1].ctx.commands == {"second": {"by": "rev1", "decision": "approve"}}


def test_a_step_that_now_answers_otherwise_or_pauses_diverges() -> None:
    async def first(ctx: StepContext) -> dict[str, Any]:
        return {"a": 2}

    async def second(ctx: StepContext) -> Pause:
        return Pause("review")

    wf = WorkflowDef("two-steps", (StepDef("first", first), StepDef("second", second)))
    rec = Recorded(workflow="wf-1", kind="two-steps", sealer=Sealer(MemoryKeyStore()),
                   envs={"voice.workflows": [START, outcome(0, 1, output={"a": 1}),
                                             outcome(1, 1, output={"b": 2})]},
                   log=RecordedLog({}))
    found = asyncio.run(rerun_steps(VoiceSettings(), rec, definition=lambda *_a: wf))
    assert found == ["step 'first': output differs at .a",
                     "step 'second' paused for 'review'; it had succeeded"]


def test_differing_names_paths() -> None:
    assert differing({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == [".a[1].b"]
    assert differing({"a": [1]}, {"a": [1, 2]}) == [".a"]
    assert differing({"x": 1}, {"x": 1}) == []


# --- a turn's kinds: the outcome applied where the step ran, only lifecycle records -------------


def test_a_step_whose_outcome_has_no_record_is_seen_from_its_success_record() -> None:
    """Issue 14: a turn's outcome is applied in its step's task, so the log holds its
    lifecycle records only; the fold takes each success record for the outcome it stands for,
    with the attempt that succeeded, and counts a success once where the outcome was
    recorded too (older logs)."""
    from schemas.workflow import LastStepSucceeded, StepFailed, StepStarted, StepSucceeded

    def started(index: int, attempt: int) -> Envelope:
        return env(StepStarted(workflow="wf-1", step=WF.step(index).name, attempt=attempt))

    ran = succeeded_steps(WF, [
        START, started(0, 1),
        env(StepFailed(workflow="wf-1", step="first", attempt=1, error_type="WorkerLost",
                       error="lost")),
        started(0, 2), env(StepSucceeded(workflow="wf-1", step="first", attempt=2,
                                         output={"a": 1})),
        started(1, 1), env(LastStepSucceeded(workflow="wf-1", step="second", attempt=1,
                                             output={"b": 2}))], max_attempts=3)
    assert [(r.ctx.step, r.ctx.attempt, r.output) for r in ran] == [
        ("first", 2, {"a": 1}), ("second", 1, {"b": 2})]
    assert ran[1].ctx.outputs == {"first": {"a": 1}}
    both = succeeded_steps(WF, [
        START, outcome(0, 1, output={"a": 1}),
        env(StepSucceeded(workflow="wf-1", step="first", attempt=1, output={"a": 1})),
        outcome(1, 1, output={"b": 2}),
        env(LastStepSucceeded(workflow="wf-1", step="second", attempt=1, output={"b": 2}))],
        max_attempts=3)
    assert [(r.ctx.step, r.output) for r in both] == [("first", {"a": 1}), ("second", {"b": 2})]
