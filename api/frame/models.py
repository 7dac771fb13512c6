"""Response bodies every product's routes share: the 409 of a too-old cursor, a cancel."""

from __future__ import annotations

from pydantic import BaseModel


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
