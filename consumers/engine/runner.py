"""The agent runner: the one owner of the model client, handed to every product of a worker.

It builds the client lazily (inside the worker's event loop, on first use) from the settings
and ``ANTHROPIC_*`` (``consumers.engine.client``), makes the effect sinks whose records carry
a turn's model calls, tool calls and display events, and runs an ``AgentSpec`` on the turn loop.
A test or a benchmark passes its own client (a ``ModelPort`` fake) instead.

It also keeps the worker's ``TokenBudget`` (model tokens per tenant per day): ``client_for``
gives a turn the model port that counts its tenant's tokens and refuses a turn that starts
over the budget (``TOKEN_QUOTA_EXCEEDED``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from consumers.engine.budget import TokenBudget
from consumers.engine.cancel import CancelToken
from consumers.engine.client import ModelSettings, model_client
from consumers.engine.effects import SOURCE, EffectSink, KafkaEffectSink, RecordSender
from consumers.engine.loop import run_turn
from consumers.engine.model import (
    ModelPort,
    ModelRequest,
    ModelResponse,
    StreamCallbacks,
    as_model_port,
)
from consumers.engine.tools import ToolRegistry
from consumers.engine.types import AgentSpec, TurnInput, TurnResult
from streams.crashpoints import CrashPoints
from streams.sealing import Sealer
from streams.settings import VoiceSettings


class AgentRunner:
    """Runs agents for one worker: its model client, its sinks, the turn loop."""

    def __init__(self, settings: VoiceSettings, producer: Callable[[], RecordSender],
                 sealer: Sealer | None = None, client: Any = None,
                 model: ModelSettings | None = None, crash: CrashPoints | None = None
                 ) -> None:
        """``producer`` returns the producer (a worker creates it lazily, in its loop);
        ``crash``: the worker's test crash points (none by default)."""
        self.settings = settings
        self.sealer = sealer
        self._producer = producer
        self._client = client
        self._model = model
        self._port: ModelPort | None = None
        self.budget = TokenBudget(settings.quota_tenant_tokens_per_day,
                                  max_tenants=settings.quota_tracked_keys)
        self.crash = crash or CrashPoints()

    @property
    def client(self) -> Any:
        """The model client (built on first use; a ``ModelPort`` fake when one was given)."""
        if self._client is None:
            self._client = model_client(self.settings, self._model or ModelSettings())
        return self._client

    def client_for(self, tenant: str | None, workflow: str = "") -> ModelPort:
        """The model port of one turn of ``tenant`` (the default tenant when unknown): counts
        its tokens against the tenant's budget, and refuses the turn if it is spent.
        ``workflow`` names the turn's workflow (for the test-only crash points)."""
        if self._port is None:
            self._port = as_model_port(self.client)
        port = self.budget.port(self._port, tenant or self.settings.default_tenant)
        if self.crash.armed("model_call", workflow):
            return CrashDuringCall(port, self.crash, workflow)
        return port

    @property
    def producer(self) -> RecordSender:
        return self._producer()

    def spec(self, name: str, identity: str, tools: ToolRegistry | None = None,
             model: str | None = None, **budget: Any) -> AgentSpec:
        """An ``AgentSpec`` on the settings' models (``model`` overrides the main one)."""
        return AgentSpec(name=name, identity=identity, tools=tools or ToolRegistry(),
                         model=model or self.settings.model,
                         fallback_models=tuple(self.settings.fallback_models),
                         compaction_model=self.settings.compaction_model,
                         allowed_models=self.settings.allowed_models, **budget)

    def sink(self, workflow: str, *, sealed: bool = False, tenant: str | None = None,
             causation: str | None = None, source: str = SOURCE) -> EffectSink:
        """Where a turn's effects go: records keyed by ``workflow`` on ``voice.agent`` (and
        telemetry), sealed with the worker's sealer when ``sealed``."""
        return KafkaEffectSink(self.producer, self.settings, workflow,
                               self.sealer if sealed else None, tenant=tenant,
                               causation=causation, source=source)

    async def run(self, spec: AgentSpec, turn_input: TurnInput, sink: EffectSink,
                  cancel: CancelToken | None = None, tenant: str | None = None) -> TurnResult:
        """One agent turn of ``tenant`` on the turn loop; returns once every effect is durable."""
        return await run_turn(spec, turn_input, self.client_for(tenant), sink, cancel)


class CrashDuringCall:
    """Tests only (``VOICE_TEST_CRASH_AT=model_call@…``): the worker dies while a model call
    of the workflow is in flight, before the step has seen its answer."""

    IN_FLIGHT_S = 0.5

    def __init__(self, inner: ModelPort, crash: CrashPoints, workflow: str) -> None:
        self.inner, self.crash, self.workflow = inner, crash, workflow

    async def stream(self, request: ModelRequest, callbacks: StreamCallbacks) -> ModelResponse:
        call = asyncio.ensure_future(self.inner.stream(request, callbacks))
        await asyncio.wait([call], timeout=self.IN_FLIGHT_S)
        self.crash.hit("model_call", self.workflow)
        return await call
