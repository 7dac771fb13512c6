"""Request and response bodies of the participant's conversation routes (and SSE event data)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, JsonValue

from api.frame.models import NonBlank, RequestModel
from schemas.conversation import TurnState

# --- requests ---------------------------------------------------------------------------------


class MessageIn(RequestModel):
    """``POST …/messages``. The byte limit (``VOICE_MAX_MESSAGE_BYTES``) is checked by the route,
    which knows the settings; it answers the same 422 shape, located at ``body.text``."""

    text: NonBlank = Field(description="The participant's message: non-blank, at most "
                                  "VOICE_MAX_MESSAGE_BYTES UTF-8 bytes (16 KiB by default).")

# --- responses --------------------------------------------------------------------------------


class ConversationCreated(BaseModel):
    conversation: str


class ConversationSummary(BaseModel):
    conversation: str
    last_seq: int | None
    """The conversation's last seq this edge has; null for one this edge has not read lately
    (an edge holding only the conversations in use lists the others from the index by owner:
    open it to read it)."""


class MessageOut(BaseModel):
    seq: int
    text: str
    at: str


class MessageAccepted(BaseModel):
    """``202``: the message is on the log; its turn is read at ``…/turns/{turn}``."""

    turn: str
    message: MessageOut


class ReplyOut(BaseModel):
    seq: int
    text: str


class TurnOut(BaseModel):
    turn: str
    state: TurnState
    reply: ReplyOut | None = None
    proposal: dict[str, JsonValue] | None = None
    reason: str | None = None
    """Why the turn ended so, in words (opened for the conversation's owner)."""
    reason_code: str | None = None
    """Why, as a stable code: ``could_not_interpret``, ``cancelled``, ``step_failed``."""


class TranscriptMessage(BaseModel):
    """A participant's message (``at`` set) or the agent's reply (``turn`` set)."""

    seq: int
    role: Literal["participant", "agent"]
    text: str
    at: str | None = None
    turn: str | None = None


class ProposalOut(BaseModel):
    seq: int
    turn: str
    proposal: dict[str, JsonValue]


class TurnSummary(BaseModel):
    turn: str
    state: TurnState
    reason: str | None = None
    """Why the turn ended so, in words (opened for the conversation's owner)."""
    reason_code: str | None = None
    """Why, as a stable code: ``could_not_interpret``, ``cancelled``, ``step_failed``."""


class ConversationOut(BaseModel):
    """One page of a conversation's transcript (the newest, unless ``before`` was given)."""

    conversation: str
    messages: list[TranscriptMessage]
    proposals: list[ProposalOut]
    turns: list[TurnSummary]
    """The turns whose message is on this page."""
    last_seq: int
    """The conversation's last seq this edge has: a stream resumed after it misses nothing."""
    older: int | None = None
    """Older messages exist: ask again with ``before`` set to this. None on the oldest page."""


# --- SSE event data ---------------------------------------------------------------------------


class ParticipantMessageEvent(BaseModel):
    """``event: message`` for a participant's message."""

    seq: int
    role: Literal["participant"] = "participant"
    message_id: str
    text: str
    at: str


class AgentMessageEvent(BaseModel):
    """``event: message`` for the agent's reply."""

    seq: int
    role: Literal["agent"] = "agent"
    turn: str
    text: str


class DeltaEvent(BaseModel):
    """``event: delta`` (no ``id:``): the agent's reply as the model writes it. Append ``text``
    at ``offset`` of what attempt ``attempt`` of the turn has shown (start again when the
    attempt changes; ignore a delta past what you have). Transient: the turn's ``message`` event
    replaces every delta, and is what a reconnecting client gets."""

    turn: str
    attempt: int
    offset: int
    text: str


class ProposalEvent(BaseModel):
    """``event: proposal``."""

    seq: int
    turn: str
    proposal: dict[str, JsonValue]


class TurnEvent(BaseModel):
    """``event: turn``: a turn's state changed (Thinking → Replied or CouldNotInterpret)."""

    seq: int
    turn: str
    state: TurnState
    reason: str | None = None
    """Why the turn ended so, in words (opened for the conversation's owner)."""
    reason_code: str | None = None
    """Why, as a stable code: ``could_not_interpret``, ``cancelled``, ``step_failed``."""
