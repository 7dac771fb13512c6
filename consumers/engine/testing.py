"""Fakes for tests of code that runs turns (like Pydantic AI's ``FunctionModel``).

``ScriptedModel`` is a ``ModelPort`` that answers each call from a script and keeps every
request it got (``deploy.simulator.serve_simulator`` runs the bundled simulator for tests that go
through the real ``anthropic`` SDK). Never used in production paths.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Any

from consumers.engine.model import ModelError, ModelRequest, ModelResponse, StreamCallbacks
from consumers.engine.types import Usage

Step = Any
"""A list of content blocks, a ``ModelResponse``, an exception to raise, or a callable taking
the ``ModelRequest`` and returning one of those."""


def text(s: str) -> dict[str, Any]:
    return {"type": "text", "text": s}


def tool_use(name: str, input_: dict[str, Any], id_: str | None = None) -> dict[str, Any]:
    block = {"type": "tool_use", "name": name, "input": input_}
    if id_ is not None:
        block["id"] = id_
    return block


class ScriptedModel:
    """Answers model calls from ``steps`` in order (the last step repeats when ``repeat``)."""

    def __init__(self, steps: Sequence[Step], *, chunk: int = 7, repeat: bool = False,
                 input_tokens: Callable[[ModelRequest], int] | None = None) -> None:
        self.steps = list(steps)
        self.chunk = chunk
        self.repeat = repeat
        self.requests: list[ModelRequest] = []
        self._input_tokens = input_tokens
        self._ids = 0

    async def stream(self, request: ModelRequest, callbacks: StreamCallbacks) -> ModelResponse:
        self.requests.append(copy.deepcopy(request))
        index = len(self.requests) - 1
        if index >= len(self.steps):
            if not (self.repeat and self.steps):
                raise ModelError("SCRIPT_EXHAUSTED", f"no step {index + 1} scripted",
                                 error_type="ScriptExhausted")
            index = len(self.steps) - 1
        step = self.steps[index]
        if callable(step) and not isinstance(step, ModelResponse):
            step = step(request)
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, ModelResponse):
            response = step
        else:
            blocks = []
            for b in step:
                b = copy.deepcopy(b)
                if b["type"] == "tool_use" and "id" not in b:
                    self._ids += 1
                    b["id"] = f"toolu_scripted_{self._ids}"
                blocks.append(b)
            stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
            chars = len(json.dumps([request.system, request.tools, request.messages]))
            tokens = self._input_tokens(request) if self._input_tokens else chars // 4
            out = sum(len(json.dumps(b)) for b in blocks) // 4 + 1
            response = ModelResponse(blocks, stop, request.model, Usage(tokens, out),
                                     f"msg_scripted_{len(self.requests)}")
        for block in response.content:
            if block.get("type") == "text" and callbacks.on_text is not None:
                t = block.get("text", "")
                for i in range(0, len(t), self.chunk):
                    await callbacks.on_text(t[i:i + self.chunk])
            elif block.get("type") == "tool_use" and callbacks.on_tool_start is not None:
                await callbacks.on_tool_start(block["name"])
        return response
