"""Display events: what SSE clients see of a turn, built by one ``DisplayFactory`` per turn.

Text deltas are coalesced by time, as the model streams: the first delta of a slice starts a
``COALESCE_S`` (50 ms) clock and everything that arrives until it runs out goes out as one
``text_delta`` — so a short reply arrives as it is written, not whole at the end, and a fast
stream is not one record per token. Pending text also goes out before any other event (order
is kept), at the end of the stream, and at once when it reaches ``MAX_SLICE_CHARS`` (a record
stays small). Slice boundaries therefore depend on timing; a replay compares a turn's text,
not its slices (``consumers.engine.replay``). Progress events are transient
(``persistent=False``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from consumers.engine.effects import EffectSink
from consumers.engine.types import DisplayChunk, DisplayEvent, DisplayType

COALESCE_S = 0.05
"""Longest a streamed piece of text waits for more before it is emitted."""
MAX_SLICE_CHARS = 4000
"""Pending text this long is emitted at once, whatever the clock says."""

CHANNELS: dict[str, str] = {
    "text_delta": "response", "text_complete": "response",
    "reasoning": "thinking", "tool_call": "thinking", "tool_result": "thinking",
    "busy": "status", "idle": "status", "status": "status", "progress": "status",
    "card": "artifact",
    "cost": "system", "error": "system", "warning": "system", "done": "system",
}
VERBS: dict[str, str] = {
    "text_delta": "append", "text_complete": "replace", "reasoning": "append",
    "tool_call": "start", "tool_result": "finish", "busy": "set", "idle": "clear",
    "status": "set", "progress": "update", "card": "show", "cost": "set", "error": "show",
    "warning": "show", "done": "finish",
}
PRIORITIES: dict[str, int] = {"error": 3, "warning": 2, "busy": 1, "status": 1, "done": 3}


class DisplayFactory:
    """Builds one turn's display events and emits them as ``DisplayChunk`` effects."""

    def __init__(self, sink: EffectSink, key_prefix: str, turn_id: str,
                 conversation_id: str | None = None, message_id: str | None = None,
                 coalesce_s: float = COALESCE_S, max_slice_chars: int = MAX_SLICE_CHARS,
                 clock: Callable[[], float] = time.time) -> None:
        self._sink = sink
        self._prefix = key_prefix
        self._turn = turn_id
        self._conversation = conversation_id
        self._message = message_id or turn_id
        self._coalesce_s = max(0.0, coalesce_s)
        self._limit = max(1, max_slice_chars)
        self._clock = clock
        self._buffer = ""
        self._seq = 0
        self._lock = asyncio.Lock()
        """Held while an event is emitted: the timer's flush and the turn's own events take
        turns, so ids and records stay in order."""
        self._timer: asyncio.Task[None] | None = None
        self.text_emitted = 0
        """Characters of response text emitted so far (a fallback after a partial stream
        tells the client to discard them)."""

    async def emit(self, type_: DisplayType, data: dict[str, Any], *, scope: str = "turn",
                   persistent: bool = True, group_id: str | None = None,
                   parent_id: str | None = None, display_id: str | None = None,
                   metadata: dict[str, Any] | None = None) -> DisplayEvent:
        """Emit one event (pending text first, so the client sees things in order)."""
        async with self._lock:
            if type_ != "text_delta":
                await self._flush_locked()
            return await self._emit(type_, data, scope=scope, persistent=persistent,
                                    group_id=group_id, parent_id=parent_id,
                                    display_id=display_id, metadata=metadata)

    async def _emit(self, type_: DisplayType, data: dict[str, Any], *, scope: str = "turn",
                    persistent: bool = True, group_id: str | None = None,
                    parent_id: str | None = None, display_id: str | None = None,
                    metadata: dict[str, Any] | None = None) -> DisplayEvent:
        self._seq += 1
        key = f"{self._prefix}/d{self._seq}"
        event = DisplayEvent(
            id=key, type=type_, channel=CHANNELS[type_], scope=scope, message_id=self._message,
            verb=VERBS.get(type_), priority=PRIORITIES.get(type_, 0), data=data,
            persistent=persistent, ts=self._clock(), group_id=group_id, parent_id=parent_id,
            display_id=display_id, metadata=metadata or {})
        await self._sink.emit(DisplayChunk(key=key, turn_id=self._turn,
                                           conversation_id=self._conversation, event=event))
        return event

    # --- response text
    async def text(self, delta: str) -> None:
        """Buffer a text delta; it goes out within ``coalesce_s`` (at once past
        ``max_slice_chars``, or with no clock at all when ``coalesce_s`` is 0)."""
        if not delta:
            return
        async with self._lock:
            self._buffer += delta
            while len(self._buffer) >= self._limit:
                piece, self._buffer = self._buffer[:self._limit], self._buffer[self._limit:]
                await self._text_delta(piece)
            if not self._buffer:
                self._stop_timer()
            elif self._coalesce_s == 0:
                await self._flush_locked()
            elif self._timer is None:
                self._timer = asyncio.ensure_future(self._flush_after(self._coalesce_s))

    async def _flush_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        async with self._lock:
            self._timer = None  # before any await: a delta from now on starts a new clock
            await self._flush_locked()

    def _stop_timer(self) -> None:
        """Cancel a timer that has not begun flushing (one that has holds the lock, so a
        caller holding it never sees that)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def drop_pending_text(self) -> int:
        """Forget buffered text not yet emitted (a failed attempt's partial stream)."""
        self._stop_timer()
        dropped, self._buffer = len(self._buffer), ""
        return dropped

    async def flush_text(self) -> None:
        """Emit pending text now (the stream ended)."""
        async with self._lock:
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        self._stop_timer()
        if self._buffer:
            piece, self._buffer = self._buffer, ""
            await self._text_delta(piece)

    async def _text_delta(self, piece: str) -> None:
        self.text_emitted += len(piece)
        await self._emit("text_delta", {"text": piece})

    async def text_complete(self, content: str) -> None:
        await self.emit("text_complete", {"content": content})

    # --- thinking tab
    async def reasoning(self, text: str, group_id: str | None = None) -> None:
        await self.emit("reasoning", {"text": text}, group_id=group_id)

    async def tool_call(self, tool: str, input_: dict[str, Any], tool_use_id: str) -> None:
        await self.emit("tool_call", {"tool": tool, "input": input_, "tool_use_id": tool_use_id},
                        scope="tool", group_id=tool_use_id)

    async def tool_result(self, tool: str, output: str, duration_ms: float,
                          tool_use_id: str, envelope: str) -> None:
        await self.emit("tool_result", {"tool": tool, "output": output,
                                        "duration_ms": duration_ms, "envelope": envelope},
                        scope="tool", group_id=tool_use_id, parent_id=tool_use_id)

    # --- status bar
    async def busy(self, text: str) -> None:
        await self.emit("busy", {"text": text})

    async def idle(self) -> None:
        await self.emit("idle", {"text": ""})

    async def status(self, text: str) -> None:
        await self.emit("status", {"text": text})

    async def progress(self, text: str, percent: float | None = None,
                       current: int | None = None, total: int | None = None,
                       group_id: str | None = None) -> None:
        data: dict[str, Any] = {"text": text}
        for name, value in (("percent", percent), ("current", current), ("total", total)):
            if value is not None:
                data[name] = value
        await self.emit("progress", data, persistent=False, scope="tool", group_id=group_id)

    # --- artifacts and system
    async def card(self, card_type: str, card_data: dict[str, Any],
                   display_id: str | None = None) -> None:
        await self.emit("card", {"card_type": card_type, "card_data": card_data},
                        display_id=display_id)

    async def cost(self, usd: float, tokens_in: int, tokens_out: int, model: str) -> None:
        await self.emit("cost", {"usd": usd, "tokens_in": tokens_in, "tokens_out": tokens_out,
                                 "model": model})

    async def error(self, text: str, recoverable: bool = False, **extra: Any) -> None:
        await self.emit("error", {"text": text, "recoverable": recoverable, **extra})

    async def warning(self, text: str, recoverable: bool = True, **extra: Any) -> None:
        await self.emit("warning", {"text": text, "recoverable": recoverable, **extra})

    async def done(self, cost: float, **extra: Any) -> None:
        await self.emit("done", {"cost": cost, **extra})
