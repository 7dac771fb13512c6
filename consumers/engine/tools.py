"""Typed tools, the per-agent registry, and running one tool call.

A ``Tool`` names an input model (pydantic; its JSON Schema is what the model sees), whether it
only reads, a timeout, and ``run(args, ctx) -> Ok | Hint | Err`` (sync or async). Agents get
read-only tools only: a ``ToolRegistry`` refuses anything else, and anything off its allow-list.

``execute`` is the one place a tool runs: arguments validated, the caller's principal in the
``ToolContext``, a timeout, and a cancellation watcher racing the tool. Sync tools run in a
thread; a cancelled or timed-out thread cannot be killed in Python, so it is left to drain and
its late result is dropped. ``execute`` never raises for a tool's failure: it returns ``Err``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from consumers.engine.cancel import CancelToken
from consumers.engine.envelopes import Err, Hint, HintSignal, Ok, ToolEnvelope

ProgressCallback = Callable[..., None]


class ToolNotAllowed(Exception):
    """A tool an agent may not have (writes, or is off the agent's allow-list)."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about its caller. One dataclass, so fields can be added later."""

    principal: Any
    agent_name: str
    turn_id: str
    tool_use_id: str
    conversation_id: str | None = None
    dataset_ids: tuple[str, ...] = ()
    cancel: CancelToken = field(default_factory=CancelToken)
    progress_sink: ProgressCallback | None = None
    tenant: str | None = None
    """The turn's tenant (every aggregate carries its tenant; a tool never assumes one)."""
    capabilities: frozenset[str] = frozenset()
    """What the asking principal may do (``streams.capabilities``), as the edge resolved it
    when the request was made: never read from anything the client sent."""

    def can(self, capability: str) -> bool:
        """Whether the asking principal has ``capability``."""
        return capability in self.capabilities

    def progress(self, text: str, percent: float | None = None,
                 current: int | None = None, total: int | None = None) -> None:
        """Report progress (thread-safe; transient, never persisted)."""
        if self.progress_sink is not None:
            self.progress_sink(text, percent, current, total)


ToolRun = Callable[[Any, ToolContext], ToolEnvelope | Awaitable[ToolEnvelope]]


@dataclass(frozen=True)
class Tool:
    """One tool: ``run(args: input_model, ctx) -> Ok | Hint | Err``, sync or async."""

    name: str
    description: str
    input_model: type[BaseModel]
    run: ToolRun
    read_only: bool = True
    timeout_s: float = 30.0
    requires: str | None = None
    """A capability the asking principal must have; without it the call is ``Err("forbidden")``
    and the tool does not run (``execute`` checks it, so no tool can forget to)."""

    def input_schema(self) -> dict[str, Any]:
        """The input model's JSON Schema (made once per model: an agent's registry is built
        per turn, and pydantic's schema generation cost every turn ~1 % of a worker's CPU)."""
        return _json_schema(self.input_model)

    def to_api(self) -> dict[str, Any]:
        """The Messages API tool definition."""
        return {"name": self.name, "description": self.description,
                "input_schema": self.input_schema()}


@functools.lru_cache(maxsize=512)
def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema, shared: read it, never change it."""
    return model.model_json_schema()


class ToolRegistry:
    """The tools one agent may call, in registration order (which keeps the prompt stable)."""

    def __init__(self, tools: Iterable[Tool] = (), *, allow: Iterable[str] | None = None) -> None:
        self._allow = frozenset(allow) if allow is not None else None
        self._tools: dict[str, Tool] = {}
        self._api: list[dict[str, Any]] | None = None
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Add a tool; ``ToolNotAllowed`` for a writing tool or one off the allow-list."""
        if not tool.read_only:
            raise ToolNotAllowed(f"tool {tool.name!r} is not read-only; agents get read-only tools")
        if self._allow is not None and tool.name not in self._allow:
            raise ToolNotAllowed(f"tool {tool.name!r} is not on this agent's allow-list")
        if tool.name in self._tools:
            raise ToolNotAllowed(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool
        self._api = None

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def api_tools(self) -> list[dict[str, Any]]:
        """Tool definitions for the model, computed once (byte-stable across the loop)."""
        if self._api is None:
            self._api = [t.to_api() for t in self._tools.values()]
        return self._api

    def replaced(self, run_for: Callable[[Tool], ToolRun]) -> ToolRegistry:
        """The same tools (names, schemas) with ``run`` swapped, e.g. to serve recorded results."""
        out = ToolRegistry()
        for t in self._tools.values():
            # No ``requires``: a served result is what the recorded turn was allowed to see.
            out.register(Tool(t.name, t.description, t.input_model, run_for(t),
                              True, t.timeout_s))
        return out


@dataclass(frozen=True)
class Executed:
    envelope: ToolEnvelope
    duration_ms: float


async def execute(registry: ToolRegistry, name: str, raw_args: Any, ctx: ToolContext,
                  cancel: CancelToken) -> Executed:
    """Run one tool call to an envelope: validation, timeout, cancellation watcher."""
    started = time.perf_counter()

    def done(env: ToolEnvelope) -> Executed:
        return Executed(env, round((time.perf_counter() - started) * 1000, 3))

    tool = registry.get(name)
    if tool is None:
        return done(Hint("unknown_tool", f"there is no tool named {name!r}", registry.names))
    try:
        args = tool.input_model.model_validate(raw_args if raw_args is not None else {})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(input)'}: {e['msg']}"
                             for e in exc.errors())
        fields = tuple(tool.input_model.model_fields)
        return done(Hint("invalid_arguments", f"arguments of {name!r} do not validate: "
                         f"{problems}", fields))
    if tool.requires is not None and not ctx.can(tool.requires):
        return done(Err(f"tool {name!r} needs the capability {tool.requires!r}, which the "
                        "asking principal does not have", "forbidden"))
    if cancel.cancelled:
        return done(Err(f"tool {name!r} not run: the turn was cancelled", "cancelled"))

    if inspect.iscoroutinefunction(tool.run):
        work: asyncio.Future[Any] = asyncio.ensure_future(_await(tool.run(args, ctx)))
    else:
        work = asyncio.ensure_future(asyncio.to_thread(tool.run, args, ctx))
    watcher = asyncio.ensure_future(cancel.wait())
    try:
        finished, _ = await asyncio.wait({work, watcher}, timeout=tool.timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if work not in finished:
        _abandon(work)
        if watcher in finished:
            return done(Err(f"tool {name!r} was cancelled while running", "cancelled"))
        return done(Err(f"tool {name!r} timed out after {tool.timeout_s:g} s", "timeout"))
    try:
        result = work.result()
        if inspect.isawaitable(result):  # a sync callable that returned a coroutine
            result = await asyncio.wait_for(_await(result), tool.timeout_s)
    except HintSignal as signal:
        return done(signal.hint)
    except Exception as exc:  # a tool's bug is the model's Err, never the loop's crash
        return done(Err(f"{type(exc).__name__}: {exc}", type(exc).__name__))
    if not isinstance(result, (Ok, Hint, Err)):
        return done(Err(f"tool {name!r} returned {type(result).__name__}, not Ok | Hint | Err",
                        "contract"))
    return done(result)


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _abandon(work: asyncio.Future[Any]) -> None:
    # An async tool is cancelled; a thread drains on its own. Either way its outcome is
    # retrieved so no "exception was never retrieved" warning fires later.
    work.cancel()
    work.add_done_callback(lambda f: f.cancelled() or f.exception())


class ProgressPump:
    """Streams a tool's progress reports to the display while the tool runs.

    ``callback`` is thread-safe (sync tools report from their worker thread); reports are
    emitted in call order by one pump task. ``close`` emits what is queued and stops the pump,
    after which a thread left draining after a cancel reports nothing.
    """

    _STOP = object()

    def __init__(self, emit: Callable[[str, float | None, int | None, int | None],
                                      Awaitable[None]]) -> None:
        self._emit = emit
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._closed = False
        self._task = asyncio.ensure_future(self._run())

    def callback(self, text: str, percent: float | None = None, current: int | None = None,
                 total: int | None = None) -> None:
        if self._closed:
            return
        item = (text, percent, current, total)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._queue.put_nowait(item)
        else:
            with contextlib.suppress(RuntimeError):  # loop closed: the turn is long gone
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def _run(self) -> None:
        while (item := await self._queue.get()) is not self._STOP:
            await self._emit(*item)

    async def close(self) -> None:
        self._closed = True
        await asyncio.sleep(0)  # let hand-offs already scheduled from a thread land first
        self._queue.put_nowait(self._STOP)
        await self._task
