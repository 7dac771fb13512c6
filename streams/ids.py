"""Ids that more than one side of Voice builds or reads: tenant ids, inbox and review-queue
keys, and the one turn-id format.

A tenant id is short and plain (``TENANT_PATTERN``), so ``{tenant}/{sub}`` — the key of a
principal's inbox — splits one way only. A turn of a conversation (participant or assistant)
is ``{conversation}:turn-{seq}``, where ``seq`` is the seq of the record that requested it;
the turn id is also its workflow's id.
"""

from __future__ import annotations

import re

TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""What a tenant id looks like (in tokens, ``X-Tenant-ID`` and ``VOICE_DEFAULT_TENANT``)."""


def inbox_key(tenant: str | None, sub: str) -> str:
    """The key of ``sub``'s inbox in ``tenant``: a principal's inbox is per tenant."""
    return f"{tenant or ''}/{sub}"


def review_queue_key(tenant: str | None) -> str:
    """The key of ``tenant``'s review queue (one queue, so one writer and one seq, per tenant).

    A tenant id never holds ``/``, so it is never an inbox key (``{tenant}/{sub}``)."""
    return f"{tenant or ''}:review-queue"


def queue_event_id(contribution: str, event: str, review: int | None = None) -> str:
    """The one id of an event of ``contribution`` in its tenant's review queue (``review``: 1
    or 2 for ``reviewed``): derived from what happened, never from an attempt."""
    return f"{contribution}:{event}" + (f":{review}" if review is not None else "")


_TURN = re.compile(r"^(?P<conversation>.+):turn-(?P<seq>[1-9][0-9]{0,17})$")


def turn_id(conversation: str, seq: int) -> str:
    """The id of the turn requested by the record with ``seq`` (also its workflow id)."""
    return f"{conversation}:turn-{seq}"


def parse_turn(turn: str) -> tuple[str, int] | None:
    """``(conversation, seq)`` of a turn id, or None when it is not one."""
    m = _TURN.match(turn)
    return (m["conversation"], int(m["seq"])) if m else None


def turn_conversation(turn: str) -> str | None:
    """The conversation of a turn id, or None when it is not one."""
    parsed = parse_turn(turn)
    return parsed[0] if parsed else None
