"""Bodies every product's routes share: the base of every request body (``RequestModel``), a
non-blank text field, a bounded JSON object, a header's text, the 409 of a too-old cursor, a
cancel; and ``inline_schema`` for a model embedded in a route's ``responses``.

What a request may carry is bounded here, once, for every route: no string longer than
``MAX_STRING_CHARS``, no string that is not Unicode text (a lone surrogate, or undecodable
UTF-8, which ``api.frame.body`` turns into one), no JSON object larger than its limit or
nested deeper than ``MAX_JSON_DEPTH``. Each refusal is a 422 naming the field.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    JsonValue,
    ValidationInfo,
)

MAX_STRING_CHARS = 64 * 1024
"""The longest string any request field takes (``VOICE_MAX_MESSAGE_BYTES`` is at most this);
fields set their own, smaller limits."""

MAX_JSON_DEPTH = 32
"""Nesting a free-form JSON object of a request may have (objects and arrays)."""

MAX_JSON_BYTES = 64 * 1024
"""Bytes a free-form JSON object of a request may have, serialized as compact UTF-8 JSON."""


class RequestModel(BaseModel):
    """The base of every request body: unknown fields refused, and every string — at any
    depth, dict keys included — checked by pydantic as Unicode text of at most
    ``MAX_STRING_CHARS`` (a bound on every string is what makes pydantic check each one:
    an unconstrained ``str`` would pass a lone surrogate through to the first ``encode``)."""

    model_config = ConfigDict(extra="forbid", str_max_length=MAX_STRING_CHARS)


def _not_blank(value: str, info: ValidationInfo) -> str:
    if not value.strip():
        raise ValueError(f"{info.field_name} must not be empty or whitespace only")
    return value


NonBlank = Annotated[str, AfterValidator(_not_blank)]
"""A text field that must not be empty or whitespace only (the 422 names the field)."""


def _shallow(value: Any, info: ValidationInfo) -> Any:
    """Refuse nesting deeper than ``MAX_JSON_DEPTH`` before pydantic recurses into it."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"{info.field_name} is nested deeper than {MAX_JSON_DEPTH} "
                                 "levels")
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(node, float) and not math.isfinite(node):
            raise ValueError(f"{info.field_name} holds {node!r}, which is not a JSON number")
    return value


def _small(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{info.field_name} is {size} bytes as JSON; the limit is "
                         f"{MAX_JSON_BYTES}")
    return value


JsonObject = Annotated[dict[str, JsonValue], BeforeValidator(_shallow), AfterValidator(_small)]
"""A free-form JSON object (a client's UI state): at most ``MAX_JSON_BYTES`` as compact JSON
and ``MAX_JSON_DEPTH`` levels deep, finite numbers only; its strings as every request's."""


def _header_text(value: str, info: ValidationInfo) -> str:
    # Starlette decodes header bytes as Latin-1; undo that to read them as UTF-8 text.
    try:
        text = value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise ValueError("the header is not valid UTF-8") from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise ValueError("the header holds a control character")
    return text


HeaderText = Annotated[str, AfterValidator(_header_text)]
"""A header value read as UTF-8 text: undecodable bytes or control characters answer 422
naming the header."""


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with its ``$defs`` resolved in place, for a schema embedded in
    a route's ``responses``: FastAPI moves to ``components`` the definitions of the models it
    registers, not of a schema handed to it, so a ``#/$defs/…`` reference there resolves to
    nothing in the OpenAPI document. Recursive definitions cannot be inlined (ValueError)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any, seen: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [resolve(v, seen) for v in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in seen:
                raise ValueError(f"{model.__name__}: $defs/{name} is recursive")
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return {**resolve(defs[name], seen | {name}), **resolve(rest, seen)}
        return {k: resolve(v, seen) for k, v in node.items()}

    return resolve(schema, frozenset())


def sse_event_schema(event: str, data: type[BaseModel]) -> dict[str, Any]:
    """The schema of one event of a ``text/event-stream`` response: its ``event`` name, its
    ``id`` and its ``data``, a JSON document of ``data``'s schema (``contentSchema``; comments,
    such as keep-alives, are not events)."""
    return {"type": "object", "required": ["event", "data"],
            "properties": {"event": {"const": event}, "id": {"type": "string"},
                           "data": {"type": "string", "contentMediaType": "application/json",
                                    "contentSchema": inline_schema(data)}}}


class CursorTooOldOut(BaseModel):
    """``409`` of a stream (or a read) from a cursor: reconnect with ``after=oldest_cursor``
    (events before it are gone from this edge) or read the aggregate instead."""

    detail: str
    oldest_cursor: int


class CancelRequested(BaseModel):
    """A cancel was recorded for a running turn (``state`` is what the edge knows now)."""

    turn: str
    state: str
    cancel: str = "requested"
