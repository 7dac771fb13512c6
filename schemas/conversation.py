"""Records of the participant's conversations: the commands the edge sends and the log the
conversation's sequencer appends. Content (messages, replies, proposals) is always ``Sealed``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.base import Record, Sealed, record_type

TurnState = Literal["Thinking", "Replied", "CouldNotInterpret"]


class Concern(BaseModel):
    """One concern the agent extracted, with the participant's words it came from."""

    model_config = ConfigDict(frozen=True)

    statement: str
    quote: str


class NewIssue(BaseModel):
    model_config = ConfigDict(frozen=True)

    title: str
    summary: str = ""


class Proposal(BaseModel):
    """What the concern-extraction agent proposes (sealed inside ``ProposalRecorded``)."""

    model_config = ConfigDict(frozen=True)

    concerns: list[Concern]
    relates_to_issue: str | None = None
    """An existing issue the concerns relate to, when one fits."""
    new_issue: NewIssue | None = None
    """A new issue to raise, when none fits and the participant asks for something."""


# --- commands (topic voice.commands, key = conversation id) ---------------------------------


@record_type("voice.conversation.start.v1")
class StartConversation(Record):
    """Open a new conversation owned by ``owner``."""

    conversation: str = Field(pattern=r"^cnv-[0-9a-f]{8,32}$")
    owner: str = Field(min_length=1)
    """The participant's subject (JWT ``sub``)."""


@record_type("voice.conversation.send_message.v1")
class SendMessage(Record):
    """A participant's message, sealed at the edge before it is produced."""

    conversation: str
    message_id: str
    """Stable id of this content; the seal's AAD names it (the seq is not known yet)."""
    text: Sealed
    idempotency_key: str | None = None


@record_type("voice.conversation.erase.v1")
class EraseConversation(Record):
    """The owner asked to erase the conversation; its key is already deleted."""

    conversation: str


@record_type("voice.conversation.expire_turn.v1")
class ExpireTurn(Record):
    """The janitor of the worker owning the conversation found ``turn`` open past its
    deadline: the sequencer ends it (``DEADLINE_EXCEEDED``) if it is still open, else ignores
    this. Command id ``{turn}:deadline``."""

    conversation: str
    turn: str


# --- the conversation log (topic voice.conversations, key = conversation id) -----------------


@record_type("voice.conversation.started.v1")
class ConversationStarted(Record):
    conversation: str
    owner: str


@record_type("voice.conversation.message_recorded.v1")
class MessageRecorded(Record):
    conversation: str
    message_id: str
    text: Sealed
    at: str
    """ISO-8601 time the sequencer recorded it."""


@record_type("voice.conversation.turn_requested.v1")
class TurnRequested(Record):
    """Starts the conversation-turn workflow ``{conversation}:turn-{message_seq}``."""

    conversation: str
    turn: str
    message_seq: int = Field(ge=1)


@record_type("voice.conversation.reply_recorded.v1")
class ReplyRecorded(Record):
    conversation: str
    turn: str
    reply_id: str
    text: Sealed


@record_type("voice.conversation.reply_delta.v1")
class ReplyDelta(Record):
    """A piece of a turn's reply as the model streams it, for live SSE clients (on
    ``voice.deltas``, never on the conversation's log). ``offset`` is where ``text`` starts in
    the reply shown so far by attempt ``attempt`` of the turn; the turn's ``ReplyRecorded``
    replaces every delta."""

    conversation: str
    turn: str
    attempt: int = Field(ge=1)
    offset: int = Field(ge=0)
    text: Sealed

    @staticmethod
    def content_id(turn: str, attempt: int, offset: int) -> str:
        """What ``text`` is sealed under (the seal's AAD binds it to this piece)."""
        return f"{turn}/delta/{attempt}/{offset}"


@record_type("voice.conversation.proposal_recorded.v1")
class ProposalRecorded(Record):
    conversation: str
    turn: str
    proposal_id: str
    proposal: Sealed
    """The sealed JSON of a ``Proposal``: concerns and the issue they relate to or raise."""


@record_type("voice.conversation.turn_state_changed.v1")
class TurnStateChanged(Record):
    conversation: str
    turn: str
    state: TurnState
    reason: str | None = None
    """Plain text; only records written before reasons were sealed carry it (read, never
    written: it may quote the model or the participant)."""
    reason_code: str | None = None
    """Why, as a plain code: ``could_not_interpret``, ``cancelled``, ``step_failed``."""
    sealed_reason: Sealed | None = None
    """The reason in words, sealed with the conversation's key (content id
    ``{turn}:reason``): the model's own words may quote the participant."""


@record_type("voice.conversation.history_summarised.v1")
class HistorySummarised(Record):
    """A summary of the conversation through ``through_seq``, made by the compaction model
    when a turn's history was over its budget (submitted by the turn's step). Later turns read
    it and only the records after ``through_seq``, so what a turn reads stays bounded."""

    conversation: str
    turn: str
    summary_id: str
    through_seq: int = Field(ge=1)
    """The last seq of the conversation the summary covers."""
    text: Sealed


# --- folded records: one record on the log for records that always come together ---------
# A reader that renders or counts records one by one expands them (``Record.implied``,
# ``streams.envelope.unfolded``) into exactly the records, at exactly the seqs, it read before
# they were folded; the older, separate records stay readable as they are.


class TranscriptRef(BaseModel):
    """Where the transcript a turn reads is on its conversation's log, besides its message:
    positions (seq, offset), never content."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    summary: tuple[int, int] | None = None
    """(seq, offset) of the latest ``HistorySummarised``, if any."""
    entries: list[tuple[int, int]] = Field(default_factory=list)
    """(seq, offset) of the messages and replies after it, oldest first: the most recent whose
    sealed content fits the read budget (``VOICE_HISTORY_READ_BYTES``) with the message's."""
    omitted_through: int = Field(default=0, ge=0)
    """The last seq left out unsummarised (over the read budget); 0 if none."""


@record_type("voice.conversation.turn_opened.v1")
class TurnOpened(MessageRecorded):
    """A participant's message and the turn it opens, as one record holding three seqs: the
    ``MessageRecorded`` at its own seq ``n``, ``TurnRequested`` (which starts the turn's
    workflow) at ``n + 1`` and ``TurnStateChanged(Thinking)`` at ``n + 2``."""

    seqs: ClassVar[int] = 3

    turn: str
    """The turn it opens: ``{conversation}:turn-{n}``."""
    history: TranscriptRef | None = None
    """What the turn reads before this message, by position (the writer learns each record's
    offset from the broker); None when the writer knows no positions of this conversation
    (begun before it kept them): the worker's transcript table has them."""

    def implied(self, seq: int) -> tuple[Record, ...]:
        return (TurnRequested(conversation=self.conversation, turn=self.turn, message_seq=seq),
                TurnStateChanged(conversation=self.conversation, turn=self.turn,
                                 state="Thinking"))


@record_type("voice.conversation.turn_replied.v1")
class TurnReplied(ReplyRecorded):
    """A turn's reply that ends it, as one record holding two seqs: the ``ReplyRecorded`` at
    its own seq and ``TurnStateChanged(Replied)`` at the next."""

    seqs: ClassVar[int] = 2

    def implied(self, seq: int) -> tuple[Record, ...]:  # noqa: ARG002
        return (TurnStateChanged(conversation=self.conversation, turn=self.turn,
                                 state="Replied"),)


@record_type("voice.conversation.turn_replied_with_proposal.v1")
class TurnRepliedWithProposal(ReplyRecorded):
    """A turn's reply, its proposal and its end, as one record holding three seqs: the
    ``ReplyRecorded`` at its own seq, ``ProposalRecorded`` at the next and
    ``TurnStateChanged(Replied)`` after it."""

    seqs: ClassVar[int] = 3

    proposal_id: str
    proposal: Sealed
    """The sealed JSON of a ``Proposal`` (content id ``proposal_id``)."""

    def implied(self, seq: int) -> tuple[Record, ...]:  # noqa: ARG002
        return (ProposalRecorded(conversation=self.conversation, turn=self.turn,
                                 proposal_id=self.proposal_id, proposal=self.proposal),
                TurnStateChanged(conversation=self.conversation, turn=self.turn,
                                 state="Replied"))


@record_type("voice.conversation.erased.v1")
class ConversationErased(Record):
    conversation: str


# --- the index of conversations by owner (topic voice.owners, key = streams.ids.owner_key) --


@record_type("voice.conversation.indexed.v1")
class ConversationIndexed(Record):
    """``owner`` started ``conversation`` (the tenant is the envelope's): what a participant's
    list reads on an edge that holds only the conversations in use (decision 0015). Written
    from the log's ``ConversationStarted`` by the worker that reads it, at least once: the
    index is a set. Metadata only; erasure acts on the conversation's data key, and the list
    leaves out a conversation whose key is gone."""

    conversation: str
    owner: str


# --- a turn's results in one command (topic voice.commands, key = conversation id) ----------


@record_type("voice.conversation.turn_results.v1")
class RecordTurnResults(Record):
    """Everything a turn's step records, as one command (id ``{turn}:results``): the sequencer
    appends the summary, the reply, the proposal and the turn's end, in that order, in one
    decision — the same records on the log as the four commands it replaces (which it still
    takes), for one command, one table write and no acknowledgement (nobody waits on it).
    A turn no longer open refuses it whole, which is also how a redelivery is dropped."""

    conversation: str
    turn: str
    summary: HistorySummarised | None = None
    reply: ReplyRecorded | None = None
    proposal: ProposalRecorded | None = None
    ended: TurnStateChanged
    """The turn's end (``Replied`` or ``CouldNotInterpret``), always last."""

    @model_validator(mode="after")
    def _one_turn(self) -> RecordTurnResults:
        for part in (self.summary, self.reply, self.proposal, self.ended):
            if part is not None and (part.conversation, part.turn) != (self.conversation,
                                                                       self.turn):
                raise ValueError(f"a result of turn {part.turn!r} of {part.conversation!r} "
                                 f"in the results of turn {self.turn!r} of "
                                 f"{self.conversation!r}")
        if self.ended.state == "Thinking":
            raise ValueError(f"the results of turn {self.turn!r} must end it, not leave it "
                             "'Thinking'")
        return self

    def parts(self) -> tuple[Record, ...]:
        """The records it appends, in log order: a reply (and its proposal) that end the
        turn ``Replied`` are one record holding their seqs and the end's (``TurnReplied``,
        ``TurnRepliedWithProposal``); else each is a record of its own."""
        summary = (self.summary,) if self.summary is not None else ()
        if self.reply is not None and self.ended == TurnStateChanged(
                conversation=self.conversation, turn=self.turn, state="Replied"):
            reply = self.reply.model_dump()
            if self.proposal is None:
                return (*summary, TurnReplied(**reply))
            return (*summary, TurnRepliedWithProposal(
                **reply, proposal_id=self.proposal.proposal_id, proposal=self.proposal.proposal))
        return (*summary, *(p for p in (self.reply, self.proposal) if p is not None),
                self.ended)
