"""The turn's work log: what the turn did, in order, for the ``done`` display event.

One entry per tool call (tool, envelope, the hint or error kind, duration) and per model call
(model, tokens, latency, the error kind of a failed attempt). It is read off the effects as they
pass to the sink (``WorkLogSink``), so the log says exactly what was recorded and no caller has
to remember to add to it. Bounded: the first ``MAX_ENTRIES`` entries are kept and the rest only
counted, so a long agentic turn cannot make ``done`` outgrow a record. No content: arguments,
results and text never enter it. Timings are named ``duration_ms`` / ``latency_ms``, which replay
already ignores (``consumers.engine.replay.IGNORED``), so a re-run still compares equal.
"""

from __future__ import annotations

from typing import Any

from consumers.engine.effects import EffectSink
from consumers.engine.types import Effect, ModelCallEffect, ToolCallEffect

MAX_ENTRIES = 64
"""Entries kept in ``done.data.work_log``; later ones are counted in ``work_log_omitted``."""


class WorkLog:
    """The entries of one turn, in the order their effects were emitted."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self.entries: list[dict[str, Any]] = []
        self.omitted = 0

    def observe(self, effect: Effect) -> None:
        """Add the entry ``effect`` stands for, if it is a model or tool call."""
        entry = _entry(effect)
        if entry is None:
            return
        if len(self.entries) < self.max_entries:
            self.entries.append(entry)
        else:
            self.omitted += 1

    def done_data(self) -> dict[str, Any]:
        """``{"work_log": [...]}``, with ``work_log_omitted`` when entries were left off."""
        data: dict[str, Any] = {"work_log": list(self.entries)}
        if self.omitted:
            data["work_log_omitted"] = self.omitted
        return data


def _entry(effect: Effect) -> dict[str, Any] | None:
    if isinstance(effect, ToolCallEffect):
        return {"kind": "tool", "tool": effect.tool_name, "envelope": effect.envelope,
                "error_kind": effect.err_kind or effect.hint_kind,
                "executed": effect.executed, "duration_ms": effect.duration_ms}
    if isinstance(effect, ModelCallEffect):
        return {"kind": "model", "model": effect.response_model or effect.request_model,
                "input_tokens": effect.input_tokens, "output_tokens": effect.output_tokens,
                "error_kind": effect.error_kind, "latency_ms": effect.latency_ms}
    return None


class WorkLogSink:
    """An ``EffectSink`` that notes each effect in a ``WorkLog`` and passes it on."""

    def __init__(self, inner: EffectSink, log: WorkLog) -> None:
        self.inner, self.log = inner, log

    async def emit(self, effect: Effect) -> None:
        self.log.observe(effect)
        await self.inner.emit(effect)

    async def drain(self) -> None:
        drain = getattr(self.inner, "drain", None)  # a sink without it is durable per emit
        if drain is not None:
            await drain()
