"""A worker's state on request: ``kill -USR1 <pid>`` logs what it holds and where it waits.

A turn that stops on the log (``Thinking`` with nothing after its last record) may be a step
still running, a record held as a lease, a record handed to an agent that never finished, or
one never handed out; from the outside those look the same. The dump tells them apart: one
``WARNING`` line ``worker state: {json}`` (the default log level shows it) with each source's
snapshot — the workflow runtime's steps, leases and locks
(``consumers.workflows.runtime.WorkflowRuntime.snapshot``), the consumer's records in flight and
per partition its commit floor and unacknowledged offsets (``consumers.frame.handover.VoiceApp
.snapshot``) — and, per event loop, where its tasks wait (the innermost frames of each, counted).

It names records by topic, partition and offset and code by file and line; it never prints a
value or a local variable (mode's own ``SIGUSR1`` dump, which this replaces, prints every
frame's locals: a participant's words among them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FRAMES = 3
"""A task is named by its innermost this many frames (and the innermost of Voice's own)."""
ROOT = str(Path(__file__).resolve().parents[2]) + "/"


def where(task: asyncio.Task[Any], frames: int = FRAMES) -> str:
    """Where ``task`` waits: the innermost frames of its chain of awaits, outermost first, as
    ``file:line function`` (``Task.get_stack`` gives only the task's own coroutine's)."""
    chain = []
    coro: Any = task.get_coro()
    while coro is not None and len(chain) < 64:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        chain.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    if not chain:
        return "finished" if task.done() else "not started"
    inner = chain[-frames:]
    ours = [f for f in chain if _ours(f.f_code.co_filename)]
    named = " > ".join(_at(f) for f in inner)
    if ours and ours[-1] not in inner:  # the innermost of Voice's own code, first
        named = f"{_at(ours[-1])} … {named}"
    return named


def _at(frame: Any) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"


def _ours(filename: str) -> bool:
    """Whether ``filename`` is Voice's own code (not a library's)."""
    return filename.startswith(ROOT) and "site-packages" not in filename


def waiting(loop: asyncio.AbstractEventLoop | None) -> dict[str, int]:
    """Each place ``loop``'s tasks wait, with how many wait there (most first)."""
    if loop is None or loop.is_closed():
        return {}
    try:
        tasks = list(asyncio.all_tasks(loop))
    except RuntimeError:  # the loop's thread changed its tasks meanwhile: say so, not fail
        return {"(tasks changed while read)": 0}
    return dict(Counter(where(t) for t in tasks).most_common())


def state(sources: dict[str, Callable[[], Any]],
          loops: dict[str, Callable[[], asyncio.AbstractEventLoop | None]]) -> dict[str, Any]:
    """Every source's snapshot (a failing one as its error) and every loop's waiting tasks."""
    out: dict[str, Any] = {}
    for name, snapshot in sources.items():
        try:
            out[name] = snapshot()
        except Exception as exc:  # noqa: BLE001 - a dump says what it could not read
            out[name] = f"unread: {exc!r}"
    out["tasks"] = {name: waiting(loop()) for name, loop in loops.items()}
    return out


def dump(sources: dict[str, Callable[[], Any]],
         loops: dict[str, Callable[[], asyncio.AbstractEventLoop | None]]) -> None:
    """Log ``state`` as one ``WARNING`` line."""
    log.warning("worker state: %s", json.dumps(state(sources, loops), default=str))


def install(sources: dict[str, Callable[[], Any]],
            loops: dict[str, Callable[[], asyncio.AbstractEventLoop | None]]) -> None:
    """Dump on every ``SIGUSR1`` to this process, from the running loop (which must be the
    process's main thread's)."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump, sources, loops)
