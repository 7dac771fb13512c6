"""The agent runner: the one owner of the model client, handed to every product of a worker.

It builds the client lazily (inside the worker's event loop, on first use) from the settings
and ``ANTHROPIC_*`` (``consumers.engine.client``), makes the effect sinks whose records carry
a turn's model calls, tool calls and display events, and runs an ``AgentSpec`` on the turn loop.
A test or a benchmark passes its own client (a ``ModelPort`` fake) instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from consumers.engine.cancel import CancelToken
from consumers.engine.client import ModelSettings, model_client
from consumers.engine.effects import SOURCE, EffectSink, KafkaEffectSink, RecordSender
from consumers.engine.loop import run_turn
from consumers.engine.tools import ToolRegistry
from consumers.engine.types import AgentSpec, TurnInput, TurnResult
from streams.sealing import Sealer
from streams.settings import VoiceSettings


class AgentRunner:
    """Runs agents for one worker: its model client, its sinks, the turn loop."""

    def __init__(self, settings: VoiceSettings, producer: Callable[[], RecordSender],
                 sealer: Sealer | None = None, client: Any = None,
                 model: ModelSettings | None = None) -> None:
        """``producer`` returns the producer (a worker creates it lazily, in its loop)."""
        self.settings = settings
        self.sealer = sealer
        self._producer = producer
        self._client = client
        self._model = model

    @property
    def client(self) -> Any:
        """The model client (built on first use; a ``ModelPort`` fake when one was given)."""
        if self._client is None:
            self._client = model_client(self.settings, self._model or ModelSettings())
        return self._client

    @property
    def producer(self) -> RecordSender:
        return self._producer()

    def spec(self, name: str, identity: str, tools: ToolRegistry | None = None,
             model: str | None = None, **budget: Any) -> AgentSpec:
        """An ``AgentSpec`` on the settings' models (``model`` overrides the main one)."""
        return AgentSpec(name=name, identity=identity, tools=tools or ToolRegistry(),
                         model=model or self.settings.model,
                         fallback_models=tuple(self.settings.fallback_models),
                         compaction_model=self.settings.compaction_model, **budget)

    def sink(self, workflow: str, *, sealed: bool = False, tenant: str | None = None,
             causation: str | None = None, source: str = SOURCE) -> EffectSink:
        """Where a turn's effects go: records keyed by ``workflow`` on ``voice.agent`` (and
        telemetry), sealed with the worker's sealer when ``sealed``."""
        return KafkaEffectSink(self.producer, self.settings, workflow,
                               self.sealer if sealed else None, tenant=tenant,
                               causation=causation, source=source)

    async def run(self, spec: AgentSpec, turn_input: TurnInput, sink: EffectSink,
                  cancel: CancelToken | None = None) -> TurnResult:
        """One agent turn on the turn loop; returns once every effect is durable."""
        return await run_turn(spec, turn_input, self.client, sink, cancel)
