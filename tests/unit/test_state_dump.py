"""``consumers.frame.state_dump``: where a worker's tasks wait, and a dump that never fails."""

from __future__ import annotations

import asyncio

from consumers.frame import state_dump


async def _innermost(gate: asyncio.Event) -> None:
    await gate.wait()


async def _middle(gate: asyncio.Event) -> None:
    await _innermost(gate)


async def _outer(gate: asyncio.Event) -> None:
    await _middle(gate)


def named_while_waiting(frames: int) -> tuple[str, dict[str, int], str]:
    """A task three awaits deep, waiting: ``where`` it is with ``frames`` frames, every place
    its loop's tasks wait, and ``where`` once it has finished."""
    async def main() -> tuple[str, dict[str, int], str]:
        gate = asyncio.Event()
        task = asyncio.get_running_loop().create_task(_outer(gate))
        await asyncio.sleep(0)
        named = state_dump.where(task, frames=frames)
        waiting = state_dump.waiting(asyncio.get_running_loop())
        assert waiting[state_dump.where(task)] == 1, waiting
        gate.set()
        await task
        return named, waiting, state_dump.where(task)

    return asyncio.run(main())


def test_a_task_is_named_by_the_awaits_it_waits_in_innermost_last() -> None:
    named, waiting, after = named_while_waiting(frames=2)
    # The innermost two frames are asyncio's Event.wait and this file's _innermost: Voice's
    # own innermost frame is among them, so nothing is put in front.
    assert named.startswith("test_state_dump.py:") and "_innermost > locks.py:" in named, named
    assert "_outer" not in named
    assert len(waiting) == 2, waiting  # and the test's own task, running
    assert after == "finished"


def test_voice_s_own_innermost_frame_is_named_first_when_a_library_s_are_deeper() -> None:
    named, _waiting, _after = named_while_waiting(frames=1)
    assert named.startswith("test_state_dump.py:") and " _innermost … locks.py:" in named, named


def test_a_source_that_fails_is_reported_and_the_rest_still_dumped(caplog) -> None:  # noqa: ANN001
    def broken() -> object:
        raise KeyError("gone")

    with caplog.at_level("WARNING"):
        state_dump.dump({"ok": lambda: {"leases": {"w": "t[1]@12"}}, "broken": broken},
                        {"none": lambda: None})
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("worker state: ")
    assert '"leases": {"w": "t[1]@12"}' in line and "unread: KeyError('gone')" in line
    assert '"none": {}' in line
