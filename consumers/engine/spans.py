"""The engine's spans, named and attributed per the OpenTelemetry GenAI semantic conventions.

A turn is an ``invoke_agent {agent}`` span; each model call attempt (fallbacks included) a
``chat {model}`` client span under it; each tool call an ``execute_tool {tool}`` span. They are
current while the work runs, so the records it produces carry their ``traceparent`` (and the
telemetry sink their ids). Spans carry names, models, counts and ids only — never a prompt, a
reply or a tool's arguments: those may be someone's words (``streams.free_text``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import Span, SpanKind

from streams.tracing import failed, span

PROVIDER = "anthropic"
"""The provider every ``ModelPort`` speaks to (the simulator speaks its Messages API)."""


@contextmanager
def agent_span(agent_name: str, turn_id: str, conversation_id: str | None) -> Iterator[Span]:
    """The span of one agent turn."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent",
                                  "gen_ai.provider.name": PROVIDER,
                                  "gen_ai.agent.name": agent_name, "voice.turn_id": turn_id}
    if conversation_id is not None:
        attributes["gen_ai.conversation.id"] = conversation_id
    with span(f"invoke_agent {agent_name}", attributes=attributes) as current:
        yield current


@contextmanager
def model_span(model: str, max_tokens: int, sampling: dict[str, float],
               fallback: bool) -> Iterator[Span]:
    """The span of one model call attempt (``chat {model}``)."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,  # the older name, still read by many backends
        "gen_ai.request.model": model, "gen_ai.request.max_tokens": max_tokens,
        "voice.fallback_used": fallback}
    for name, value in sampling.items():  # temperature, top_p, top_k (SAMPLING_KEYS)
        attributes[f"gen_ai.request.{name}"] = value
    with span(f"chat {model}", SpanKind.CLIENT, attributes) as current:
        yield current


def model_answered(target: Span, response_model: str | None, input_tokens: int,
                   output_tokens: int, finish_reason: str | None) -> None:
    """What a model call answered: its model, token usage and finish reason."""
    if response_model:
        target.set_attribute("gen_ai.response.model", response_model)
    target.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    target.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    if finish_reason:
        target.set_attribute("gen_ai.response.finish_reasons", [finish_reason])


@contextmanager
def tool_span(tool_name: str, tool_call_id: str) -> Iterator[Span]:
    """The span of one tool call (``execute_tool {tool}``)."""
    with span(f"execute_tool {tool_name}", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool_name,
            "gen_ai.tool.call.id": tool_call_id}) as current:
        yield current


def tool_answered(target: Span, envelope: str, err_kind: str | None) -> None:
    """A tool call's envelope; an ``err`` marks the span in error with its kind."""
    target.set_attribute("voice.tool.envelope", envelope)
    if envelope == "err":
        failed(target, err_kind or "err")


__all__ = ["agent_span", "failed", "model_answered", "model_span", "tool_answered", "tool_span"]
