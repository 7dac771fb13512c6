"""Where workflow steps run: an event loop on a thread of their own, apart from the worker's.

The worker's Faust loop carries every consumer of the worker — the writer of every aggregate
(``consumers.frame.writer``), whose acknowledgement a request at the edge waits on, the
workflow runtime, the transcript index — and, before this, every step too: a turn's model
calls, tool calls and effects. A command then waited behind whatever a step had made ready on
that loop (``docs/benchmarks.md``: ``edge.post_message`` p99 74–155 ms, almost all of it the
command's consume hop, at 10 requests/s). Steps are coroutines that only read what their input
names and write records (``consumers.workflows.runtime``: "the task never writes state"), so
they can run on another loop; their outcome comes back to the worker's loop, which alone writes
tables and acknowledges records.

``StepLoop.run`` keeps a step's lifetime what it was on the worker's loop: its result or
exception comes back to the caller; cancelling the caller (a handover, the step's deadline)
cancels the step and waits — at most ``UNWIND_S`` — until it has unwound, so nothing of a
cancelled step runs after its outcome is reported. The step runs in a copy of the caller's
context (its trace). It must never run anything but steps, and never touch a Faust table.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

UNWIND_S = 10.0
"""At most this long a cancelled caller waits for its step to unwind on the step loop."""


class StepLoop:
    """One event loop on its own daemon thread, started at the first step, stopped by ``close``."""

    def __init__(self, name: str = "voice-steps") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The steps' loop (started on first use)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    @property
    def started(self) -> asyncio.AbstractEventLoop | None:
        """The steps' loop if a step has started it (never starts it)."""
        return self._loop

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the steps' loop (what a step's loop-bound objects need: a
        ``CancelToken`` is set there)."""
        self.loop.call_soon_threadsafe(fn, *args)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the steps' loop; its result (or exception) here, in this loop."""
        home = asyncio.get_running_loop()
        finished: asyncio.Future[T] = home.create_future()
        tasks: list[asyncio.Task[T]] = []
        context = contextvars.copy_context()

        def settle(task: asyncio.Task[T]) -> None:
            home.call_soon_threadsafe(_copy_outcome, task, finished)

        def start() -> None:
            task = asyncio.get_running_loop().create_task(coro, context=context)
            tasks.append(task)
            task.add_done_callback(settle)

        loop = self.loop
        loop.call_soon_threadsafe(start)
        try:
            return await asyncio.shield(finished)
        except asyncio.CancelledError:
            loop.call_soon_threadsafe(_cancel, tasks)  # after ``start``: the loop is FIFO
            _done, pending = await asyncio.wait([finished], timeout=UNWIND_S)
            if pending:
                log.warning("a cancelled step did not unwind within %.0f s", UNWIND_S)
            raise

    def close(self) -> None:
        """Stop the loop (the steps still on it are dropped; their records stay unacknowledged,
        so the partitions' next owner runs them again)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(_stop, loop)
            thread.join(timeout=5)


def _stop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every step, give them one pass to unwind (their callers learn it), then stop."""
    _cancel(list(asyncio.all_tasks(loop)))
    loop.call_soon(loop.stop)


def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()


def _copy_outcome(task: asyncio.Task[T], finished: asyncio.Future[T]) -> None:
    if finished.done():
        return
    if task.cancelled():
        finished.cancel()
    elif (exc := task.exception()) is not None:
        finished.set_exception(exc)
    else:
        finished.set_result(task.result())
