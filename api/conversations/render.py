"""A conversation's views → JSON for their owner: where the edge opens a conversation's content.

Every function here may raise ``streams.sealing.KeyErased`` (the conversation was erased,
perhaps by another edge whose record this edge has not read yet); routes turn it into 404.
"""

from __future__ import annotations

from fastapi.sse import ServerSentEvent
from pydantic import JsonValue

from api.conversations.models import (
    AgentMessageEvent,
    ConversationOut,
    DeltaEvent,
    ParticipantMessageEvent,
    ProposalEvent,
    ProposalOut,
    ReplyOut,
    TranscriptMessage,
    TurnEvent,
    TurnOut,
    TurnSummary,
)
from api.conversations.views import ConversationView, TurnView
from api.frame.sse import Frame, event_frame_bytes, model_json
from schemas.conversation import (
    MessageRecorded,
    ProposalRecorded,
    ReplyDelta,
    ReplyRecorded,
    TurnStateChanged,
)
from streams.envelope import Envelope
from streams.sealing import Sealer


def message_text(sealer: Sealer, env: Envelope) -> str:
    rec = env.record
    assert isinstance(rec, MessageRecorded)
    return sealer.open_text(rec.conversation, rec.message_id, rec.text)


def reply_text(sealer: Sealer, env: Envelope) -> str:
    rec = env.record
    assert isinstance(rec, ReplyRecorded)
    return sealer.open_text(rec.conversation, rec.reply_id, rec.text)


def proposal_json(sealer: Sealer, env: Envelope) -> dict[str, JsonValue]:
    rec = env.record
    assert isinstance(rec, ProposalRecorded)
    return sealer.open_json(rec.conversation, rec.proposal_id, rec.proposal)


def turn_reason(sealer: Sealer, rec: TurnStateChanged | None) -> dict[str, str | None]:
    """``reason`` (opened; a record from before reasons were sealed has it plain) and
    ``reason_code`` of a turn's state record."""
    if rec is None:
        return {"reason": None, "reason_code": None}
    reason = rec.reason
    if rec.sealed_reason is not None:
        reason = sealer.open_text(rec.conversation, f"{rec.turn}:reason", rec.sealed_reason)
    return {"reason": reason, "reason_code": rec.reason_code}


def turn_out(sealer: Sealer, tv: TurnView) -> TurnOut:
    assert tv.state is not None
    reply = None
    if tv.reply is not None:
        assert tv.reply.seq is not None
        reply = ReplyOut(seq=tv.reply.seq, text=reply_text(sealer, tv.reply))
    proposal = proposal_json(sealer, tv.proposal) if tv.proposal is not None else None
    return TurnOut(turn=tv.turn, state=tv.state, reply=reply, proposal=proposal,
                   **turn_reason(sealer, tv.ended))


def conversation_out(sealer: Sealer, view: ConversationView,
                     page: list[tuple[int, Envelope]] | None = None, older: int | None = None,
                     before: int | None = None) -> ConversationOut:
    """One page of the transcript: its messages, replies and proposals (``page``: seq and
    record, oldest first; every one the view holds when None), and the turns whose message
    seq is in ``[older, before)`` — each turn on the page of its message, whatever page its
    reply is on. ``older`` is where the page before this one begins (None: none is older)."""
    if page is None:
        page, older = view.page(before, len(view.content) + 1)
    low = older or 0
    messages: list[TranscriptMessage] = []
    proposals: list[ProposalOut] = []
    for seq, env in page:
        rec = env.record
        if isinstance(rec, MessageRecorded):
            messages.append(TranscriptMessage(seq=seq, role="participant",
                                              text=message_text(sealer, env), at=rec.at))
        elif isinstance(rec, ReplyRecorded):
            messages.append(TranscriptMessage(seq=seq, role="agent",
                                              text=reply_text(sealer, env), turn=rec.turn))
        elif isinstance(rec, ProposalRecorded):
            proposals.append(ProposalOut(seq=seq, turn=rec.turn,
                                         proposal=proposal_json(sealer, env)))
    on_page = [tv for tv in view.turns.values() if tv.state is not None
               and low <= tv.message_seq and (before is None or tv.message_seq < before)]
    turns = [TurnSummary(turn=tv.turn, state=tv.state, **turn_reason(sealer, tv.ended))
             for tv in sorted(on_page, key=lambda t: t.message_seq)]
    return ConversationOut(conversation=view.conversation, messages=messages,
                           proposals=proposals, turns=turns, last_seq=view.last_seq,
                           older=older)


EventData = ParticipantMessageEvent | AgentMessageEvent | ProposalEvent | TurnEvent


def event_data(sealer: Sealer, env: Envelope) -> tuple[str, EventData] | None:
    """The SSE event name and data of one log record, or None for records clients do not see
    (``ConversationStarted``, ``TurnRequested``): their seq is simply skipped."""
    rec = env.record
    seq = env.seq
    assert seq is not None
    if isinstance(rec, MessageRecorded):
        return "message", ParticipantMessageEvent(seq=seq, message_id=rec.message_id,
                                                  text=message_text(sealer, env), at=rec.at)
    if isinstance(rec, ReplyRecorded):
        return "message", AgentMessageEvent(seq=seq, turn=rec.turn,
                                            text=reply_text(sealer, env))
    if isinstance(rec, ProposalRecorded):
        return "proposal", ProposalEvent(seq=seq, turn=rec.turn,
                                         proposal=proposal_json(sealer, env))
    if isinstance(rec, TurnStateChanged):
        return "turn", TurnEvent(seq=seq, turn=rec.turn, state=rec.state,
                                 **turn_reason(sealer, rec))
    return None


def sse_event(sealer: Sealer, env: Envelope) -> ServerSentEvent | None:
    """The SSE event of one log record (``event_data``), or None for one clients do not see."""
    found = event_data(sealer, env)
    if found is None:
        return None
    event, data = found
    return ServerSentEvent(event=event, id=str(env.seq), data=data)


def event_frame(sealer: Sealer, env: Envelope) -> Frame | None:
    """The SSE event of one log record as its wire bytes, or None for one clients do not see.

    Bytes, not a ``ServerSentEvent``: a view renders each event once for all its streams
    (``KeptEvents.render_once``) and every stream writes the same bytes — the event's data
    is built and serialised once, no SSE model is built, nothing is framed per stream (the
    framing is FastAPI's, ``format_sse_event``, as ``sse_frame(sse_event(…))`` gives)."""
    found = event_data(sealer, env)
    if found is None:
        return None
    event, data = found
    return event_frame_bytes(model_json(data), event, str(env.seq))


def delta_event(sealer: Sealer, env: Envelope) -> ServerSentEvent:
    """The SSE ``delta`` event (no ``id:``) of a turn's streamed reply text."""
    rec = env.record
    assert isinstance(rec, ReplyDelta)
    content_id = ReplyDelta.content_id(rec.turn, rec.attempt, rec.offset)
    text = sealer.open_text(rec.conversation, content_id, rec.text)
    return ServerSentEvent(event="delta", data=DeltaEvent(turn=rec.turn, attempt=rec.attempt,
                                                          offset=rec.offset, text=text))
