"""Model calls: the static prompt, the ``[CURRENT_STATE]`` block, streaming, fallback, cost.

The static system prompt (identity, ``[agent: NAME]``, tool list, a note on the state block) is
built once per turn and sent byte-identical on every iteration as a system block with
``cache_control``, so the provider's prompt cache hits. The ``[CURRENT_STATE]`` block is rebuilt
every iteration and sent as the last user message; it is never part of canonical history.

``ModelPort`` is the seam: ``lean.LeanModel`` reads the Messages API's stream over httpx (the
default), ``AnthropicModel`` adapts ``anthropic.AsyncAnthropic`` (both: real API or the
simulator), ``replay.ReplayClient`` serves recorded responses. ``ModelCaller`` walks the
fallback chain on rate limits and overloads and records every attempt as a ``ModelCallEffect``.
An unknown model is ``ModelNotFound`` (kind ``MODEL_NOT_FOUND``): never silently substituted.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anthropic

from consumers.engine.effects import EffectSink
from consumers.engine.spans import failed, model_answered, model_span
from consumers.engine.types import AgentSpec, Keys, ModelCallEffect, TelemetryEffect, Usage

STATE_MARKER = "[CURRENT_STATE]"
_AGENT_LINE = re.compile(r"\[agent:\s*[\w.-]+\s*\]", re.I)


# ---------------------------------------------------------------------------- errors
class ModelError(Exception):
    """A model call that produced no usable response; ``fallback`` says whether the next
    model of the chain may be tried (rate limit, overload)."""

    def __init__(self, kind: str, message: str, *, error_type: str, fallback: bool = False,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.kind, self.error_type, self.fallback, self.status = kind, error_type, fallback, status


class ModelNotFound(ModelError):
    """An explicit model the provider does not know."""

    def __init__(self, model: str, message: str = "") -> None:
        super().__init__("MODEL_NOT_FOUND", message or f"model {model!r} not found",
                         error_type="NotFoundError", status=404)
        self.model = model


ERROR_KINDS: dict[str, tuple[str, bool]] = {
    # error_type (as recorded) → (kind, fallback)
    "RateLimitError": ("RATE_LIMITED", True),
    "OverloadedError": ("OVERLOADED", True),
    "NotFoundError": ("MODEL_NOT_FOUND", False),
    "MalformedResponse": ("MALFORMED_RESPONSE", False),
    "APIConnectionError": ("CONNECTION", False),
    "APITimeoutError": ("CONNECTION", False),
    "TokenQuotaExceeded": ("TOKEN_QUOTA_EXCEEDED", False),
}


def error_from_type(error_type: str, model: str, message: str = "") -> ModelError:
    """The ``ModelError`` a recorded ``error_type`` stands for (replay raises it again)."""
    if error_type == "NotFoundError":
        return ModelNotFound(model, message)
    kind, fallback = ERROR_KINDS.get(error_type, ("MODEL_ERROR", False))
    return ModelError(kind, message or f"{error_type} from {model!r}", error_type=error_type,
                      fallback=fallback)


# ---------------------------------------------------------------------------- the port
@dataclass(frozen=True)
class ModelRequest:
    model: str
    system: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int
    sampling: dict[str, float] = field(default_factory=dict)
    """``temperature`` / ``top_p`` / ``top_k`` when the request overrides them."""


SAMPLING_KEYS = ("temperature", "top_p", "top_k")


@dataclass(frozen=True)
class ModelResponse:
    content: list[dict[str, Any]]
    stop_reason: str | None
    model: str
    usage: Usage
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        u = self.usage
        return {"id": self.id, "model": self.model, "content": self.content,
                "stop_reason": self.stop_reason,
                "usage": {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                          "cache_read_input_tokens": u.cache_read_input_tokens,
                          "cache_creation_input_tokens": u.cache_creation_input_tokens}}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ModelResponse:
        u = doc.get("usage") or {}
        return cls(content=list(doc.get("content") or []), stop_reason=doc.get("stop_reason"),
                   model=doc.get("model") or "", id=doc.get("id"),
                   usage=Usage(int(u.get("input_tokens") or 0), int(u.get("output_tokens") or 0),
                               int(u.get("cache_read_input_tokens") or 0),
                               int(u.get("cache_creation_input_tokens") or 0)))

    @property
    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.content if b.get("type") == "tool_use"]


@dataclass(frozen=True)
class StreamCallbacks:
    on_text: Callable[[str], Awaitable[None]] | None = None
    on_tool_start: Callable[[str], Awaitable[None]] | None = None


class ModelPort(Protocol):
    """Streams one model call; raises ``ModelError`` for anything but a usable response."""

    async def stream(self, request: ModelRequest, callbacks: StreamCallbacks) -> ModelResponse: ...


class _CallbackFailed(Exception):  # noqa: N818 - a carrier, unwrapped before anyone sees it
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class AnthropicModel:
    """``ModelPort`` over ``anthropic.AsyncAnthropic`` (``client.messages.stream``)."""

    def __init__(self, client: anthropic.AsyncAnthropic,
                 extra_headers: dict[str, str] | None = None, max_retries: int = 0) -> None:
        # The SDK's own retries would sit out a rate limit with backoff; the engine moves to
        # the next model of the chain at once instead.
        self._client = client.with_options(max_retries=max_retries)
        self._headers = extra_headers or {}

    async def stream(self, request: ModelRequest, callbacks: StreamCallbacks) -> ModelResponse:
        kwargs: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens,
                                  "system": request.system, "messages": request.messages}
        if request.tools:
            kwargs["tools"] = request.tools
        if request.sampling:
            # The SDK's ``stream`` no longer takes temperature / top_p / top_k as arguments
            # (a TypeError before the request was sent); the API still reads them in the body.
            kwargs["extra_body"] = dict(request.sampling)
        if self._headers:
            kwargs["extra_headers"] = self._headers
        try:
            async with self._client.messages.stream(**kwargs) as stream:
                async for event in stream:
                    await _dispatch(event, callbacks)
                final = await stream.get_final_message()
        except _CallbackFailed as carrier:
            raise carrier.exc from None
        except anthropic.NotFoundError as exc:
            raise ModelNotFound(request.model, _msg(exc)) from None
        except anthropic.RateLimitError as exc:
            raise ModelError("RATE_LIMITED", _msg(exc), error_type="RateLimitError",
                             fallback=True, status=429) from None
        except anthropic.APIStatusError as exc:
            # 529, or an overloaded_error event mid-stream (status 200, error in the body).
            if exc.status_code == 529 or _body_type(exc) == "overloaded_error":
                raise ModelError("OVERLOADED", _msg(exc), error_type="OverloadedError",
                                 fallback=True, status=exc.status_code) from None
            raise ModelError("MODEL_ERROR", _msg(exc), error_type=type(exc).__name__,
                             status=exc.status_code) from None
        except (anthropic.APIConnectionError, anthropic.APIResponseValidationError) as exc:
            raise ModelError(ERROR_KINDS.get(type(exc).__name__, ("MODEL_ERROR", False))[0],
                             _msg(exc), error_type=type(exc).__name__) from None
        except ValueError as exc:  # the SDK raises ValueError / JSONDecodeError on bad SSE
            raise ModelError("MALFORMED_RESPONSE", f"malformed response: {exc}",
                             error_type="MalformedResponse") from None
        usage = final.usage
        return ModelResponse(
            content=[_block(b) for b in final.content], stop_reason=final.stop_reason,
            model=final.model, id=final.id,
            usage=Usage(usage.input_tokens or 0, usage.output_tokens or 0,
                        usage.cache_read_input_tokens or 0,
                        usage.cache_creation_input_tokens or 0))


async def _dispatch(event: Any, callbacks: StreamCallbacks) -> None:
    try:
        if event.type == "text" and callbacks.on_text is not None:
            await callbacks.on_text(event.text)
        elif (event.type == "content_block_start" and callbacks.on_tool_start is not None
              and event.content_block.type == "tool_use"):
            await callbacks.on_tool_start(event.content_block.name)
    except Exception as exc:  # ours, not the SDK's: must not be classified as a model error
        raise _CallbackFailed(exc) from exc


def _msg(exc: Exception) -> str:
    return getattr(exc, "message", None) or str(exc)


def _body_type(exc: anthropic.APIStatusError) -> str | None:
    body = exc.body if isinstance(exc.body, dict) else {}
    err = body.get("error") if isinstance(body.get("error"), dict) else body
    return err.get("type") if isinstance(err, dict) else None


def _block(block: Any) -> dict[str, Any]:
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return block.model_dump(mode="json", exclude_none=True)


def as_model_port(client: Any) -> ModelPort:
    """An ``AsyncAnthropic`` becomes an ``AnthropicModel``; a ``ModelPort`` passes through."""
    if isinstance(client, anthropic.AsyncAnthropic):
        return AnthropicModel(client)
    if callable(getattr(client, "stream", None)):
        return client
    raise TypeError(f"not a model client: {client!r}")


# ---------------------------------------------------------------------------- prices
@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_write: float


PRICES: dict[str, Price] = {
    "claude-opus-4-5": Price(5.0, 25.0, 0.5, 6.25),
    "claude-opus-4-1": Price(15.0, 75.0, 1.5, 18.75),
    "claude-opus-4": Price(15.0, 75.0, 1.5, 18.75),
    "claude-sonnet-4-5": Price(3.0, 15.0, 0.3, 3.75),
    "claude-sonnet-4": Price(3.0, 15.0, 0.3, 3.75),
    "claude-haiku-4-5": Price(1.0, 5.0, 0.1, 1.25),
    "claude-3-5-haiku": Price(0.8, 4.0, 0.08, 1.0),
}


def price_for(model: str) -> Price | None:
    """The price of a model, matched by the longest known prefix (dated ids included)."""
    hits = [name for name in PRICES if model == name or model.startswith(name + "-")]
    return PRICES[max(hits, key=len)] if hits else None


def cost_usd(model: str, usage: Usage) -> tuple[float, bool]:
    """(cost, price known); an unknown model costs 0 and is flagged by the caller."""
    p = price_for(model)
    if p is None:
        return 0.0, False
    total = (usage.input_tokens * p.input + usage.output_tokens * p.output
             + usage.cache_read_input_tokens * p.cache_read
             + usage.cache_creation_input_tokens * p.cache_write) / 1_000_000
    return round(total, 8), True


# ---------------------------------------------------------------------------- prompt
def static_system_prompt(spec: AgentSpec) -> str:
    """Identity + agent marker + tool guidance + the state-block note; byte-stable."""
    parts = [spec.identity.strip()]
    if not _AGENT_LINE.search(spec.identity):
        parts.append(f"[agent: {spec.name}]")
    if len(spec.tools):
        lines = [f"- {t.name}: {t.description}" for t in spec.tools]
        parts.append("## Tools\n" + "\n".join(lines))
        if spec.tool_guidance:
            parts.append(spec.tool_guidance.strip())
        parts.append("Every tool answers with JSON: {\"ok\": true, ...} on success, "
                     "{\"hint\": ...} for a correction to act on, {\"error\": ...} on failure.")
    parts.append(f"Each request ends with a user message starting with {STATE_MARKER}: the "
                 "current state, rebuilt every step; it is context, not the user's words. Older "
                 "tool results may be compacted to a note naming their tool call id; call the "
                 "tool again if you need the full result.")
    return "\n\n".join(parts)


def system_blocks(prompt: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}}]


def state_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": f"{STATE_MARKER}\n{text}"}]}


def with_current_state(messages: Sequence[dict[str, Any]], state_text: str) -> list[dict[str, Any]]:
    """The request's messages: history with a cache breakpoint on its last block, then the
    state block as the last user message. ``messages`` itself is not changed."""
    out = list(messages)
    if out:
        last = dict(out[-1])
        content = last.get("content")
        blocks = ([{"type": "text", "text": content}] if isinstance(content, str)
                  else [dict(b) for b in content or []])
        if blocks and blocks[-1].get("type") in ("text", "tool_use", "tool_result", "image"):
            blocks[-1]["cache_control"] = {"type": "ephemeral"}
        last["content"] = blocks
        out[-1] = last
    out.append(state_message(state_text))
    return out


# ---------------------------------------------------------------------------- the caller
@dataclass
class ModelCaller:
    """Calls a ``ModelPort`` along a fallback chain, recording every attempt and its cost."""

    port: ModelPort
    sink: EffectSink
    keys: Keys
    turn_id: str
    conversation_id: str | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    calls: int = 0
    _unpriced: set[str] = field(default_factory=set)

    async def call(self, *, agent_name: str, iteration: int, chain: Sequence[str],
                   system: list[dict[str, Any]], messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]], max_tokens: int,
                   sampling: dict[str, float] | None = None,
                   callbacks: StreamCallbacks = StreamCallbacks(),
                   on_fallback: Callable[[str, str, ModelError], Awaitable[None]] | None = None,
                   ) -> ModelResponse:
        """The first usable response along ``chain``; the last ``ModelError`` otherwise."""
        if not chain:
            raise ModelError("NO_MODEL", "no model to call", error_type="NoModel")
        for index, model in enumerate(chain):
            key = self.keys.next("m")
            started = time.perf_counter()
            request = ModelRequest(model, system, messages, tools, max_tokens,
                                   {k: v for k, v in (sampling or {}).items()
                                    if k in SAMPLING_KEYS})
            # The call's span is current while it streams and while its record is emitted:
            # the record's ``traceparent`` (and so the telemetry row) names this span.
            with model_span(model, max_tokens, request.sampling, index > 0) as span:
                try:
                    response = await self.port.stream(request, callbacks)
                except ModelError as exc:
                    failed(span, exc.error_type)
                    await self.sink.emit(ModelCallEffect(
                        key=key, turn_id=self.turn_id, conversation_id=self.conversation_id,
                        agent_name=agent_name, iteration=iteration, request_model=model,
                        latency_ms=_ms(started), fallback_used=index > 0,
                        error_type=exc.error_type, error_kind=exc.kind))
                    if exc.fallback and index + 1 < len(chain):
                        if on_fallback is not None:
                            await on_fallback(model, chain[index + 1], exc)
                        continue
                    raise
                self.calls += 1
                cost, known = cost_usd(response.model or model, response.usage)
                self.usage += response.usage
                self.cost_usd += cost
                u = response.usage
                model_answered(span, response.model, u.total_input, u.output_tokens,
                               response.stop_reason)
                await self.sink.emit(ModelCallEffect(
                    key=key, turn_id=self.turn_id, conversation_id=self.conversation_id,
                    agent_name=agent_name, iteration=iteration, request_model=model,
                    response_model=response.model, input_tokens=u.total_input,
                    output_tokens=u.output_tokens,
                    cache_read_input_tokens=u.cache_read_input_tokens,
                    cache_creation_input_tokens=u.cache_creation_input_tokens,
                    finish_reasons=[response.stop_reason] if response.stop_reason else [],
                    latency_ms=_ms(started), cost_usd=cost, price_known=known,
                    fallback_used=index > 0, response=response.to_dict()))
            if not known and model not in self._unpriced:
                self._unpriced.add(model)
                await self.sink.emit(TelemetryEffect(
                    key=self.keys.next("x"), turn_id=self.turn_id,
                    conversation_id=self.conversation_id, name="model_price_unknown",
                    attributes={"model": model, "agent_name": agent_name}))
            return response
        raise AssertionError("unreachable")  # the loop returns or raises


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
