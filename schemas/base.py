"""The record base class and the type registry.

A record model carries only the payload; the CloudEvents headers (id, type, source, time,
subject) and Voice's own (seq, tenant, correlation, causation) travel beside it, see
``streams.envelope``. A model is registered under its versioned ``ce_type`` by the
``@record_type`` decorator; changing a model's meaning means a new type name (``….v2``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field

_REGISTRY: dict[str, type[Record]] = {}

R = TypeVar("R", bound="type[Record]")


class Record(BaseModel):
    """Base of every record payload: frozen, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ce_type: ClassVar[str] = ""
    seqs: ClassVar[int] = 1
    """How many seqs of its log it holds: more than one for a record that folds the records
    that would follow it (``implied``), so one record on the log stands for several."""

    def implied(self, seq: int) -> tuple[Record, ...]:  # noqa: ARG002
        """The records this one, at ``seq``, stands for after itself: one per further seq it
        holds (``seqs - 1``), at ``seq + 1``, ``seq + 2``, … Readers that read the log record
        by record expand it (``streams.envelope.unfolded``); the writer counts them."""
        return ()


class Sealed(BaseModel):
    """Conversation content sealed with the conversation's data key (AES-256-GCM).

    Only the owner's edge and the step that hands the transcript to the model ever open it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_version: int = Field(ge=1)
    """Version of the conversation's data key that sealed it."""
    nonce: str
    """Base64 of the 96-bit nonce, never reused under one key."""
    ciphertext: str
    """Base64 of ciphertext and tag; the AAD binds conversation, content id and key version
    (see docs/decisions/0002-seal-aad-binds-content-id.md)."""


def json_bytes(model: BaseModel) -> bytes:
    """``model.model_dump_json().encode()``, the same bytes, straight from the model's
    serializer: ``model_dump_json`` wraps it in Python (its keywords, then a decode that
    the caller encodes again), 1.0 µs against 0.3 a record (docs/benchmarks.md, issue 14,
    forty-fourth pass)."""
    return type(model).__pydantic_serializer__.to_json(model)


def record_type(ce_type: str) -> Callable[[R], R]:
    """Register a record model under its versioned CloudEvents type name."""

    def register(cls: R) -> R:
        if not ce_type.startswith("voice.") or not ce_type.rsplit(".", 1)[-1].startswith("v"):
            raise ValueError(f"record type {ce_type!r} must look like 'voice.<area>.<name>.vN'")
        if ce_type in _REGISTRY and _REGISTRY[ce_type] is not cls:
            raise ValueError(f"record type {ce_type!r} is registered twice")
        cls.ce_type = ce_type
        _REGISTRY[ce_type] = cls
        return cls

    return register


def registry() -> dict[str, type[Record]]:
    """Every registered record type, by ``ce_type``."""
    return dict(_REGISTRY)


def model_for(ce_type: str) -> type[Record]:
    """The model registered under ``ce_type``; ``KeyError`` names an unknown type."""
    try:
        return _REGISTRY[ce_type]
    except KeyError:
        raise KeyError(f"unknown record type {ce_type!r}") from None


def export_json_schemas(folder: Path) -> list[Path]:
    """Write ``<ce_type>.json`` (JSON Schema draft 2020-12) for every record type."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for ce_type, model in sorted(_REGISTRY.items()):
        schema = model.model_json_schema()
        schema["$id"] = f"urn:voice:{ce_type}"
        schema["x-ce-type"] = ce_type
        path = folder / f"{ce_type}.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
