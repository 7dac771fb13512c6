"""What the staff workflows' steps share: running an agent through the engine's runner, and a
test-only delay knob (records are produced with the worker's ``Publisher``).

``run_agent`` is the one place these workflows call a model: through ``consumers.engine``'s
turn loop, so every model call, tool call and display event is a record on ``voice.agent``
(sealed with the contribution's key when the agent reads a participant's words).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from consumers.engine import AgentSpec, EffectSink, ToolRegistry, TurnInput
from consumers.engine.runner import AgentRunner
from consumers.engine.types import TurnResult
from consumers.workflows.runtime import StepError

DELAY_ENV = "VOICE_STAFF_STEP_DELAY_MS"
"""Tests only: ``step=ms,step=ms``; the named steps sleep that long at their midpoint, so a
test can kill a worker in the middle of them. Unset in every real deployment."""
_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


class StepDelays:
    """Per-step sleeps at a step's midpoint (tests only: ``VOICE_STAFF_STEP_DELAY_MS``)."""

    def __init__(self, delays: dict[str, float] | None = None) -> None:
        self.delays = delays or {}

    @classmethod
    def parse(cls, spec: str) -> StepDelays:
        """``step=ms,step=ms`` (``VoiceSettings.staff_step_delay_ms``) as delays."""
        out: dict[str, float] = {}
        for part in spec.split(","):
            name, _, ms = part.partition("=")
            if name.strip() and ms.strip():
                out[name.strip()] = float(ms) / 1000
        return cls(out)

    async def midpoint(self, step: str) -> None:
        if self.delays.get(step):
            await asyncio.sleep(self.delays[step])


class Agents:
    """Runs the staff agents (research assistant, privacy flagging) on the worker's runner."""

    def __init__(self, runner: AgentRunner) -> None:
        self.runner = runner

    def spec(self, name: str, identity: str, tools: ToolRegistry | None = None,
             **budget: Any) -> AgentSpec:
        return self.runner.spec(name, identity, tools, **budget)

    async def run(self, spec: AgentSpec, workflow: str, turn_id: str, message: str,
                  attempt: int, sealed_as: str | None = None, tenant: str | None = None
                  ) -> TurnResult:
        """One agent turn; its effects become records keyed by ``workflow``.

        ``sealed_as`` names the key that seals the turn's content (a contribution id) when
        the agent reads a participant's words; ``None`` leaves staff content unsealed.
        """
        sink = self.sink_for(workflow, sealed_as is not None, tenant)
        result = await self.runner.run(spec, TurnInput(turn_id=turn_id, user_message=message,
                                                       conversation_id=sealed_as,
                                                       attempt=attempt), sink,
                                      tenant=tenant)
        if result.end_reason == "error":
            kinds = ", ".join(f"{e.kind}: {e.message}" for e in result.errors)
            raise StepError(f"agent {spec.name!r} failed: {kinds}", retryable=result.retryable)
        return result

    def sink_for(self, workflow: str, sealed: bool, tenant: str | None) -> EffectSink:
        """Where a turn's effects go: records keyed by the workflow (tests swap this)."""
        return self.runner.sink(workflow, sealed=sealed, tenant=tenant)


def fenced_json(text: str) -> dict[str, Any] | None:
    """The last fenced JSON object of an agent's answer (or the whole answer, if JSON)."""
    blocks = _FENCED.findall(text or "")
    for candidate in [*reversed(blocks), text or ""]:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
