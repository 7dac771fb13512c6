"""Records of Voice's own plumbing: command acknowledgements the edge waits on."""

from __future__ import annotations

from typing import Literal

from schemas.base import Record, record_type


@record_type("voice.system.command_acknowledged.v1")
class CommandAcknowledged(Record):
    """The writer of an aggregate took (or refused) a command; key = the command's id."""

    command_id: str
    aggregate: str
    outcome: Literal["accepted", "duplicate", "rejected"]
    seq: int | None = None
    """The seq the command's main record got (for a duplicate, the original's)."""
    detail: dict[str, str | int | None] = {}
