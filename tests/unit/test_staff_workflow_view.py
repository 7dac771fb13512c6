"""The edge's view of ``voice.workflows``: a turn's workflow is let go of some time after it
ends, every other workflow is kept (issue 14: an edge grew ~9 KB a turn for ever)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import pytest
from pydantic import ValidationError

from api.staff.views import StaffViews, Workflows
from schemas.workflow import (
    LastStepSucceeded,
    StepFailed,
    StepOutcome,
    StepStarted,
    WorkflowCommandReceived,
    WorkflowFailed,
    WorkflowResumed,
    WorkflowStarted,
)
from streams.envelope import Envelope
from streams.ids import turn_id, workflow_turn
from streams.settings import VoiceSettings


def rec(workflow: str, record: Any, seq: int | None, tenant: str = "t1") -> Envelope:
    return Envelope(record=record, key=workflow, source="/test", seq=seq, tenant=tenant,
                    id=f"{workflow}:{seq if seq is not None else type(record).__name__}")


def turn_records(workflow: str, kind: str = "conversation-turn", fail: bool = False
                 ) -> list[Envelope]:
    """A turn's workflow as the runtime writes it: started, its step, the step's outcome
    (no seq), and its end."""
    out = [rec(workflow, WorkflowStarted(workflow=workflow, kind=kind,
                                         input={"conversation": workflow.split(":")[0],
                                                "tenant": "t1"}), 1),
           rec(workflow, StepStarted(workflow=workflow, step="reply", attempt=1), 2),
           rec(workflow, StepOutcome(workflow=workflow, step="reply", step_index=0, attempt=1,
                                     status="failed" if fail else "succeeded",
                                     output={"state": "Replied"}), None)]
    if fail:
        out += [rec(workflow, StepFailed(workflow=workflow, step="reply", attempt=1,
                                         error_type="Boom"), 3),
                rec(workflow, WorkflowFailed(workflow=workflow, step="reply", attempts=1,
                                             error_type="Boom"), 4)]
    else:
        out.append(rec(workflow, LastStepSucceeded(workflow=workflow, step="reply", attempt=1,
                                                   output={"state": "Replied"}), 3))
    return out


def apply_all(view: Workflows, envs: list[Envelope]) -> None:
    for e in envs:
        view.apply(e)


def test_a_workflow_of_a_turn_is_told_by_its_id() -> None:
    turn = turn_id("cnv-0190abcdef12aabbccddeeff", 5)
    assert workflow_turn(turn) == turn
    assert workflow_turn(f"{turn}:extract") == turn  # the assistant's extraction of a turn
    for other in ("run-1", "ctb-9", "iss-1:dev-2", "iss-1:dev-2:alice", "cnv-1:turn-0",
                  f"{turn}:extract:more", ":turn-5", ""):
        assert workflow_turn(other) is None, other


def test_ended_turn_workflows_past_the_bound_are_let_go_of_the_first_ended_first() -> None:
    view = Workflows(turns_kept=3)
    turns = [turn_id(f"cnv-{i}", 2) for i in range(5)]
    apply_all(view, turn_records(turns[0]))
    apply_all(view, turn_records(turns[1], fail=True))
    running = turn_id("cnv-running", 2)
    apply_all(view, turn_records(running)[:2])  # started, its step running
    for t in turns[2:]:
        apply_all(view, turn_records(t))
    assert turns[0] not in view and turns[1] not in view
    assert [t in view for t in turns[2:]] == [True, True, True]
    assert view[running].status == "running", "a running turn's workflow is never let go of"
    assert view.turns_let_go == 2
    # A late record of one let go of (a redelivered outcome) does not bring it back.
    view.apply(turn_records(turns[0])[2])
    view.apply(turn_records(turns[0])[3])
    assert turns[0] not in view


def test_a_failed_turn_workflow_retried_runs_again_and_is_not_let_go_of_while_it_runs() -> None:
    view = Workflows(turns_kept=1)
    failed = turn_id("cnv-a", 2)
    apply_all(view, turn_records(failed, fail=True))
    assert view[failed].status == "failed"
    view.apply(rec(failed, WorkflowCommandReceived(workflow=failed, command="retry",
                                                   command_id="r1", by="op"), None))
    view.apply(rec(failed, WorkflowResumed(workflow=failed, step="reply"), 5))
    assert view[failed].status == "running"
    apply_all(view, turn_records(turn_id("cnv-b", 2)))
    apply_all(view, turn_records(turn_id("cnv-c", 2)))
    assert failed in view and view[failed].status == "running"
    assert turn_id("cnv-b", 2) not in view and turn_id("cnv-c", 2) in view
    view.apply(rec(failed, LastStepSucceeded(workflow=failed, step="reply", attempt=2,
                                             output={}), 6))
    assert failed in view and turn_id("cnv-c", 2) not in view, \
        "the retried one ended last, so it is the one kept"


def test_workflows_not_of_a_turn_are_all_kept() -> None:
    view = Workflows(turns_kept=0)
    for i in range(50):
        run = f"run-{i}"
        apply_all(view, [rec(run, WorkflowStarted(workflow=run, kind="research",
                                                  input={"issue": {"issue": "iss-1"}}), 1),
                         rec(run, LastStepSucceeded(workflow=run, step="s", attempt=1,
                                                    output={}), 2)])
    apply_all(view, turn_records(turn_id("cnv-x", 2)))
    assert len(view) == 50 and all(view[f"run-{i}"].status == "completed" for i in range(50))
    assert view.turns_let_go == 1


async def test_a_waiter_on_a_turn_workflow_let_go_of_is_woken() -> None:
    view = Workflows(turns_kept=0)
    turn = turn_id("cnv-w", 2)
    apply_all(view, turn_records(turn)[:2])
    waiting = asyncio.create_task(view.wait(turn, lambda w: w is None or w.status != "running",
                                            5))
    await asyncio.sleep(0)
    apply_all(view, turn_records(turn)[2:])
    assert await asyncio.wait_for(waiting, 1) is True
    assert view.get(turn) is None


def test_the_edge_takes_the_bound_from_its_settings() -> None:
    assert Workflows().turns_kept == VoiceSettings().edge_turn_workflows_kept == 1000
    assert StaffViews(turn_workflows_kept=7).workflows.turns_kept == 7
    with pytest.raises(ValidationError, match="edge_turn_workflows_kept"):
        VoiceSettings(edge_turn_workflows_kept=0)  # one read back must outlive its request


@pytest.mark.parametrize("turns", [2000])
def test_the_view_of_many_turns_stays_the_size_of_the_bound(turns: int) -> None:
    """What the view holds after ``turns`` turns does not grow with them: 4,000 turns hold
    what 2,000 do (within 10 %), at a bound of 200."""

    def held(n: int) -> int:
        view = Workflows(turns_kept=200)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(n):
                apply_all(view, turn_records(turn_id(f"cnv-{i}", 2)))
            gc.collect()
            return tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()

    small, large = held(turns), held(2 * turns)
    assert large < small * 1.1, (small, large)


class Log:
    """A fake of the log's reader: the records of each workflow, and the reads asked of it."""

    def __init__(self, *workflows: list[Envelope]) -> None:
        self.records = {envs[0].key: envs for envs in workflows}
        self.reads: list[str] = []
        self.fail = False

    def __call__(self, key: str) -> list[Envelope]:
        self.reads.append(key)
        if self.fail:
            from api.frame.cold import ColdReadFailed

            raise ColdReadFailed("the partition could not be read")
        return self.records.get(key, [])


TIMED = "cnv-0190abcdef12aabbccddeeff"
"""A conversation id that carries its time: its turns' workflows can be read from the log."""


async def test_a_turn_workflow_let_go_of_is_read_from_the_log_when_asked_for() -> None:
    first, second = turn_id(TIMED, 2), turn_id(TIMED, 7)
    log = Log(turn_records(first, fail=True), turn_records(second))
    view = Workflows(turns_kept=1, cold=log)
    apply_all(view, log.records[first])
    apply_all(view, log.records[second])
    assert first not in view
    assert await view.ensure(first, 5) is True
    assert view[first].status == "failed" and view[first].tenant == "t1"
    assert [e.seq for e in view[first].records] == [1, 2, None, 3, 4]
    assert second not in view, "read back, it is the last ended: the bound still holds"
    assert await view.ensure(first, 5) is True and log.reads == [first], "held: not read again"


async def test_one_read_serves_every_asker_and_nothing_found_is_not_read_again() -> None:
    turn = turn_id(TIMED, 2)
    log = Log(turn_records(turn))
    view = Workflows(turns_kept=1, cold=log)
    assert await asyncio.gather(view.ensure(turn, 5), view.ensure(turn, 5)) == [True, True]
    assert log.reads == [turn] and view[turn].status == "completed"
    missing = turn_id(TIMED, 99)
    assert await view.ensure(missing, 5) is True and missing not in view
    assert await view.ensure(missing, 5) is True and log.reads == [turn, missing]
    # It starts later after all: the tail brings it, as any live workflow.
    apply_all(view, turn_records(missing)[:2])
    assert view[missing].status == "running"


async def test_a_turn_workflow_asked_for_before_it_started_is_read_again_once_let_go_of(
) -> None:
    """An id remembered as absent is forgotten once its workflow is held: let go of later,
    asking for it reads it again."""
    early, later = turn_id(TIMED, 2), turn_id(TIMED, 7)
    log = Log()
    view = Workflows(turns_kept=1, cold=log)
    assert await view.ensure(early, 5) is True and early not in view  # not on the log yet
    log.records = {early: turn_records(early), later: turn_records(later)}
    apply_all(view, log.records[early])  # the tail brings it, then a later turn's
    apply_all(view, log.records[later])
    assert early not in view, "let go of: one ended turn is kept"
    assert await view.ensure(early, 5) is True and view[early].status == "completed"
    assert log.reads == [early, early]


async def test_only_a_turn_of_a_timed_conversation_is_read_and_a_failed_read_is_tried_again(
) -> None:
    log = Log()
    view = Workflows(cold=log)
    for key in ("run-1", "iss-1:dev-2:alice", turn_id("cnv-0011223344556677", 2)):
        assert await view.ensure(key, 5) is True
    assert log.reads == [], "not a turn's, or a conversation id without its time: no scan"
    from api.frame.cold import ColdReadFailed

    log.fail = True
    turn = turn_id(TIMED, 2)
    with pytest.raises(ColdReadFailed):
        await view.ensure(turn, 5)
    log.fail = False
    assert await view.ensure(turn, 5) is True and log.reads == [turn, turn]


async def test_records_the_tail_brings_while_a_turn_workflow_is_read_apply_after_it() -> None:
    """Regression: a record of a turn's workflow the tail brought while its read from the log
    ran was dropped (not held: its ``WorkflowStarted`` had not been applied yet), so a retry's
    records past the read's end were missing from the view for good."""
    turn = turn_id(TIMED, 2)
    failed = turn_records(turn, fail=True)  # seqs 1..4, ended failed
    retried = [rec(turn, WorkflowResumed(workflow=turn, step="reply"), 5),
               rec(turn, StepStarted(workflow=turn, step="reply", attempt=2), 6)]
    gate = asyncio.Event()

    class HeldLog(Log):
        def __call__(self, key: str) -> list[Envelope]:
            found = super().__call__(key)  # the partition's end when the read began …
            asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(5)
            return found

    loop = asyncio.get_running_loop()
    view = Workflows(cold=HeldLog(failed))
    asker = asyncio.create_task(view.ensure(turn, 5))
    await asyncio.sleep(0.05)
    apply_all(view, retried)  # … and the tail brings the retry while it runs
    assert turn not in view
    gate.set()
    assert await asker is True
    assert [e.seq for e in view[turn].records] == [1, 2, None, 3, 4, 5, 6]
    assert view[turn].status == "running"
    apply_all(view, retried)  # redelivered: nothing changes
    assert [e.seq for e in view[turn].records][-2:] == [5, 6]
