"""What the staff workflows' steps share: producing records, running an agent through the
engine, and a test-only delay knob.

``run_agent`` is the one place these workflows call a model: through ``consumers.engine``'s
turn loop, so every model call, tool call and display event is a record on ``voice.agent``
(sealed with the contribution's key when the agent reads a participant's words).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from typing import Any

from consumers.engine import (
    AgentSpec,
    EffectSink,
    KafkaEffectSink,
    ToolRegistry,
    TurnInput,
    run_turn,
)
from consumers.engine.types import TurnResult
from consumers.model_client import model_client
from consumers.workflows.runtime import StepError
from streams.envelope import Envelope, encode
from streams.producer import RecordProducer
from streams.sealing import Sealer
from streams.settings import VoiceSettings
from streams.topics import TopicSpec, topic_name

DELAY_ENV = "VOICE_STAFF_STEP_DELAY_MS"
"""Tests only: ``step=ms,step=ms``; the named steps sleep that long at their midpoint, so a
test can kill a worker in the middle of them. Unset in every real deployment."""
_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


class StepDelays:
    """Per-step sleeps at a step's midpoint (see ``DELAY_ENV``)."""

    def __init__(self, delays: dict[str, float] | None = None) -> None:
        self.delays = delays or {}

    @classmethod
    def from_env(cls) -> StepDelays:
        out: dict[str, float] = {}
        for part in (os.environ.get(DELAY_ENV) or "").split(","):
            name, _, ms = part.partition("=")
            if name.strip() and ms.strip():
                out[name.strip()] = float(ms) / 1000
        return cls(out)

    async def midpoint(self, step: str) -> None:
        if self.delays.get(step):
            await asyncio.sleep(self.delays[step])


class Producing:
    """Produces records with the worker's producer and waits for the broker's acks."""

    def __init__(self, settings: VoiceSettings, producer: Callable[[], RecordProducer]) -> None:
        self.settings = settings
        self._producer = producer

    @property
    def producer(self) -> RecordProducer:
        return self._producer()

    async def send(self, spec: TopicSpec, env: Envelope) -> None:
        key, value, headers = encode(env)
        await self._producer().produce_raw(topic_name(self.settings, spec), key, value, headers)

    async def send_all(self, items: list[tuple[TopicSpec, Envelope]]) -> None:
        """Produce in order (one partition per key keeps it), then wait for every ack."""
        futs = []
        for spec, env in items:
            key, value, headers = encode(env)
            futs.append(self._producer().produce_raw(topic_name(self.settings, spec), key,
                                                     value, headers))
        for fut in futs:
            await fut


class Agents:
    """Runs the staff agents (research assistant, privacy flagging) through the engine."""

    def __init__(self, settings: VoiceSettings, out: Producing, sealer: Sealer,
                 client: Any = None) -> None:
        self.settings = settings
        self.out = out
        self.sealer = sealer
        self._client: Any = client

    def spec(self, name: str, identity: str, tools: ToolRegistry | None = None,
             **budget: Any) -> AgentSpec:
        return AgentSpec(name=name, identity=identity, tools=tools or ToolRegistry(),
                         model=self.settings.model,
                         fallback_models=tuple(self.settings.fallback_models),
                         compaction_model=self.settings.compaction_model, **budget)

    async def run(self, spec: AgentSpec, workflow: str, turn_id: str, message: str,
                  attempt: int, sealed_as: str | None = None, tenant: str | None = None
                  ) -> TurnResult:
        """One agent turn; its effects become records keyed by ``workflow``.

        ``sealed_as`` names the key that seals the turn's content (a contribution id) when
        the agent reads a participant's words; ``None`` leaves staff content unsealed.
        """
        if self._client is None:  # created in the worker's event loop, on first use
            self._client = model_client(self.settings)
        sink = self.sink_for(workflow, sealed_as is not None, tenant)
        result = await run_turn(spec, TurnInput(turn_id=turn_id, user_message=message,
                                                conversation_id=sealed_as, attempt=attempt),
                                self._client, sink)
        if result.end_reason == "error":
            kinds = ", ".join(f"{e.kind}: {e.message}" for e in result.errors)
            raise StepError(f"agent {spec.name!r} failed: {kinds}")
        return result


    def sink_for(self, workflow: str, sealed: bool, tenant: str | None) -> EffectSink:
        """Where a turn's effects go: records keyed by the workflow (tests swap this)."""
        return KafkaEffectSink(self.out.producer, self.settings, workflow,
                               self.sealer if sealed else None, tenant=tenant)


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
