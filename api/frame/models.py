"""Bodies every product's routes share: a non-blank text field, the 409 of a too-old cursor,
a cancel."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ValidationInfo


def _not_blank(value: str, info: ValidationInfo) -> str:
    if not value.strip():
        raise ValueError(f"{info.field_name} must not be empty or whitespace only")
    return value


NonBlank = Annotated[str, AfterValidator(_not_blank)]
"""A text field that must not be empty or whitespace only (the 422 names the field)."""


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
