"""Workflow steps on a loop of their own (``consumers.workflows.steploop``): a step holding its
loop no longer delays the worker's loop (where the writer acknowledges commands), and a step's
result, failure, cancellation and context are what they were on the worker's loop."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Iterator

import pytest

from consumers.engine.cancel import CancelToken
from consumers.workflows.steploop import StepLoop

HOLD_S = 0.4
"""How long the test step holds its loop without awaiting (a long synchronous stretch)."""

trace: contextvars.ContextVar[str] = contextvars.ContextVar("trace", default="none")


@pytest.fixture
def steps() -> Iterator[StepLoop]:
    loop = StepLoop("test-steps")
    yield loop
    loop.close()


async def _lateness_while(step: asyncio.Future[object] | asyncio.Task[object]) -> float:
    """How late a 10 ms timer of this loop fires, at worst, while ``step`` runs."""
    worst = 0.0
    while not step.done():
        due = time.monotonic() + 0.01
        await asyncio.sleep(0.01)
        worst = max(worst, time.monotonic() - due)
    return worst


async def _holding_step() -> str:
    await asyncio.sleep(0)
    time.sleep(HOLD_S)  # holds whatever loop it runs on, as a long synchronous stretch does
    return threading.current_thread().name


async def test_a_step_holding_its_loop_does_not_delay_the_callers_loop(steps: StepLoop) -> None:
    task = asyncio.ensure_future(steps.run(_holding_step()))
    lateness = await _lateness_while(task)
    assert await task == "test-steps"
    assert lateness < HOLD_S / 2, f"the caller's loop was held {lateness:.3f} s"


async def test_the_same_step_on_the_callers_loop_delays_it() -> None:
    # The regression this guards: steps on the worker's loop held the writer's acks.
    task = asyncio.ensure_future(_holding_step())
    lateness = await _lateness_while(task)
    assert lateness >= HOLD_S / 2


async def test_a_steps_result_failure_and_context_come_back(steps: StepLoop) -> None:
    async def step() -> str:
        return trace.get()

    async def failing() -> None:
        raise ValueError("step failed")

    trace.set("turn-7")
    assert await steps.run(step()) == "turn-7"
    with pytest.raises(ValueError, match="step failed"):
        await steps.run(failing())


async def test_cancelling_the_caller_cancels_the_step_and_waits_until_it_unwound(
        steps: StepLoop) -> None:
    started, unwound = threading.Event(), threading.Event()

    async def step() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.05)  # an unwinding that takes a while
            unwound.set()

    task = asyncio.ensure_future(steps.run(step()))
    deadline = time.monotonic() + 10
    while not started.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert unwound.is_set()  # nothing of the step runs after its caller learnt it ended


async def test_a_deadline_around_the_step_still_stops_it(steps: StepLoop) -> None:
    stopped = threading.Event()

    async def step() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await steps.run(step())
    assert stopped.is_set()


async def test_a_cancel_token_is_set_on_the_steps_loop(steps: StepLoop) -> None:
    token = CancelToken()

    async def step() -> str | None:
        await token.wait()
        return token.reason

    task = asyncio.ensure_future(steps.run(step()))
    await asyncio.sleep(0.05)
    steps.call(token.cancel, "cancelled by p")
    assert await asyncio.wait_for(task, 10) == "cancelled by p"


def test_with_uvloop_the_steps_loop_is_uvloops_and_runs_steps() -> None:
    """``VOICE_WORKER_UVLOOP``: ``use_uvloop`` (set before the worker starts) makes every loop
    the process creates uvloop's, the steps' loop included; a step runs there as before."""
    import uvloop

    from consumers.app import use_uvloop

    before = asyncio.get_event_loop_policy()
    use_uvloop()
    try:
        steps = StepLoop(name="voice-steps-uv")
        assert isinstance(steps.loop, uvloop.Loop)

        async def step() -> str:
            await asyncio.sleep(0)
            return "done"

        async def main() -> str:
            return await steps.run(step())

        assert asyncio.run(main()) == "done"
        steps.close()
    finally:
        asyncio.set_event_loop_policy(before)
