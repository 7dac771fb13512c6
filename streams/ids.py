"""Ids that more than one side of Voice builds or reads: tenant ids, inbox and review-queue
keys, and the one turn-id format.

A conversation id starts with the millisecond it was made (``new_conversation_id``; an
assistant conversation's is a version 7 UUID, ``new_assistant_conversation_id``), so a reader
that must find a conversation's records in its partition — which Kafka does not index by key —
can start at that time (``conversation_since_ms``) instead of the partition's start.

A tenant id is short and plain (``TENANT_PATTERN``), so ``{tenant}/{sub}`` — the key of a
principal's inbox — splits one way only. A turn of a conversation (participant or assistant)
is ``{conversation}:turn-{seq}``, where ``seq`` is the seq of the record that requested it;
the turn id is also its workflow's id.
"""

from __future__ import annotations

import re
import time
import uuid

from streams.entropy import random_bytes, random_hex

TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""What a tenant id looks like (in tokens, ``X-Tenant-ID`` and ``VOICE_DEFAULT_TENANT``)."""


CONVERSATION_ID = r"^cnv-[0-9a-f]{8,32}$"
"""What a conversation id looks like: ``cnv-`` and 8 to 32 hex digits (older ids are 16 random
ones; new ones 12 of time and 12 random)."""
_TIMED_CONVERSATION = re.compile(r"^cnv-(?P<ms>[0-9a-f]{12})[0-9a-f]{12}$")
_TIMED_UUID = re.compile(r"^(?P<ms>[0-9a-f]{8}-[0-9a-f]{4})-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                         r"[0-9a-f]{12}$")
"""A version 7 UUID (RFC 9562) as ``str(uuid.UUID)`` writes it: its first 48 bits are the
millisecond it was made."""

CLOCK_SLACK_MS = 10 * 60 * 1000
"""How far a writer's clock (which stamps the conversation's first record) may run behind the
clock of the edge that made its id: a reader starts this much before the id's time."""


TIMED_CONVERSATION_LEN = len("cnv-") + 24


def has_time(conversation: str) -> bool:
    """Whether ``conversation`` (an id ``CONVERSATION_ID`` matches) carries the time it was
    made: every such id is ``cnv-`` + 12 hex digits of ms + 12 random, all of one length, so
    their text sorts them in the order they were made. A length check: a regular expression
    over a participant's ~90,000 ids cost the list ~40 ms."""
    return len(conversation) == TIMED_CONVERSATION_LEN


def new_conversation_id(now: float | None = None) -> str:
    """A fresh conversation id: ``cnv-`` + the creation time in ms (12 hex digits) + 48
    random bits."""
    ms = int((time.time() if now is None else now) * 1000)
    return f"cnv-{ms:012x}{random_hex(6)}"


def new_assistant_conversation_id(now: float | None = None) -> str:
    """A fresh assistant conversation id: a version 7 UUID (the creation time in ms, then 74
    random bits), so its records can be found from that time, as a ``cnv-`` id's are."""
    ms = int((time.time() if now is None else now) * 1000) & ((1 << 48) - 1)
    rand = int.from_bytes(random_bytes(10), "big") & ((1 << 80) - 1)
    value = (ms << 80) | rand
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # variant RFC 9562
    return str(uuid.UUID(int=value))


def conversation_since_ms(conversation: str) -> int | None:
    """The time (ms) from which a reader finds every record of ``conversation``: its id's
    time (a ``cnv-`` id's, or a version 7 UUID's) less ``CLOCK_SLACK_MS``; None for an id
    without a time (read from the start)."""
    m = _TIMED_CONVERSATION.match(conversation) or _TIMED_UUID.match(conversation)
    return None if m is None else max(0, int(m["ms"].replace("-", ""), 16) - CLOCK_SLACK_MS)


def inbox_key(tenant: str | None, sub: str) -> str:
    """The key of ``sub``'s inbox in ``tenant``: a principal's inbox is per tenant."""
    return f"{tenant or ''}/{sub}"


def owner_key(tenant: str | None, owner: str) -> str:
    """The key of ``owner``'s entries in the index of conversations by owner
    (``voice.owners``, decision 0015): per tenant, like an inbox's."""
    return inbox_key(tenant, owner)


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


def workflow_since_ms(workflow: str) -> int | None:
    """No record of a turn's workflow is older than this (ms): its conversation's time, from
    the conversation's id; None for any other workflow, or a conversation id without time."""
    turn = workflow_turn(workflow)
    conversation = None if turn is None else turn_conversation(turn)
    return None if conversation is None else conversation_since_ms(conversation)


def workflow_turn(workflow: str) -> str | None:
    """The turn a workflow serves, or None: a turn's own workflow has the turn's id, and one
    made for a turn (the assistant's extraction) is ``{turn}:{part}``. Such a workflow's story
    is its conversation's; each turn makes one or two, so they are most of the workflow log."""
    if _TURN.match(workflow):
        return workflow
    head, sep, _part = workflow.rpartition(":")
    return head if sep and _TURN.match(head) else None
