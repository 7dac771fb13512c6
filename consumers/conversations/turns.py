"""The conversation-turn workflow (id ``{conversation}:turn-{seq}``) and what its step reads.

The record that opens a turn (``TurnOpened``; on an older log, ``TurnRequested``) starts the
workflow (its writer produces the start once the record is on the log,
``consumers.conversations.follow_ups``) with a *reference* as its input: the conversation, the
message seq, and where on the log that record is. The record names the positions of the records
the turn reads (the latest history summary, then the messages and replies after it), from the
``TranscriptIndex`` its writer keeps (``consumers.conversations.transcript``). So a workflow's
records stay a few hundred bytes however long the conversation grows, and no table value holds a
transcript. (A conversation begun before its writer kept positions names them in the input, from
the worker's table.)

The one step reads the opening record, then those it names, back from the log
(``consumers.frame.logrefs``; on the worker whose writer put them there, from memory), opens them,
hands them to the concern-extraction agent, and submits the summary (when the engine made one
because the history was over its budget), reply, proposal and turn state to the
conversation's sequencer as one command (``RecordTurnResults``) whose id is derived from the
turn — a step re-run after a crash submits the same, and the sequencer records it once (the
turn it ends is closed by then).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from consumers.conversations.concern import ConcernReply
from consumers.conversations.follow_ups import KIND, SOURCE, turn_start
from consumers.conversations.opened import LastRead, OpenedTexts
from consumers.conversations.transcript import TranscriptIndex, reference_from
from consumers.engine.cancel import CancelToken
from consumers.engine.history import lead_with_stored
from consumers.frame.logrefs import LogReader, LogUnavailable, Position
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef, WorkflowState
from consumers.workflows.runtime import Erased, StepError, failure_words
from schemas.base import Sealed
from schemas.conversation import (
    ConversationErased,
    HistorySummarised,
    MessageRecorded,
    ProposalRecorded,
    RecordTurnResults,
    ReplyRecorded,
    TurnOpened,
    TurnRequested,
    TurnStateChanged,
)
from streams.crashpoints import CrashPoints
from streams.envelope import Envelope
from streams.free_text import seal_text
from streams.producer import Publisher
from streams.sealing import KeyErased, Sealer
from streams.topics import COMMANDS, CONVERSATIONS, WORKFLOWS

log = logging.getLogger(__name__)

READ_SETTING = "VOICE_HISTORY_READ_BYTES"

class HistoryUnreadable(StepError):
    """A turn's history cannot be read back from the log as its input refers to it.

    Its words stay plain: they name the turn and log positions, never content, so an
    operator reads in the worker's log and the step's record why the turn failed."""

    plain_message = True


ConcernAgent = Callable[[str, str, int, list[dict[str, Any]], CancelToken, str | None],
                      Awaitable[ConcernReply]]
"""(conversation, turn, attempt, Messages-API history ending with the user message, the
step's cancel token, the tenant whose model-token budget the turn uses) → reply."""


def open_entries(sealer: Sealer, conversation: str, entries: Sequence[dict[str, Any]],
                 opened: OpenedTexts | None = None) -> tuple[list[dict[str, Any]], list[int]]:
    """Sealed transcript entries (each blob a ``Sealed`` or its dict) as Messages-API history
    (opened only to hand it to the model), and the last seq each history message holds (roles
    alternate: consecutive entries of one role are joined). With ``opened``, texts opened for
    an earlier turn are taken from it, once the conversation's key is checked live."""
    blobs = [(e["content_id"], e["sealed"] if isinstance(e["sealed"], Sealed)
              else Sealed.model_validate(e["sealed"])) for e in entries]
    texts = _open_all(sealer, conversation, blobs, opened)
    return _joined(texts, [e["role"] for e in entries], [e["seq"] for e in entries])


def _open_all(sealer: Sealer, conversation: str, blobs: list[tuple[str, Sealed]],
              opened: OpenedTexts | None) -> list[str]:
    """Each (content id, blob)'s text: by the sealer, or through ``opened`` once the
    conversation's key is checked live."""
    if opened is None:
        return [sealer.open_text(conversation, content_id, sealed) for content_id, sealed in blobs]
    opened.check(conversation)
    return opened.open_all(conversation, blobs)


def _joined(texts: list[str], roles: list[str], seqs: list[int]
            ) -> tuple[list[dict[str, Any]], list[int]]:
    """The history of entries' texts, roles and seqs: consecutive entries of one role joined."""
    history: list[dict[str, Any]] = []
    last: list[int] = []
    previous = None
    for text, role, seq in zip(texts, roles, seqs, strict=True):
        if role == previous:
            history[-1]["content"] += "\n\n" + text
            last[-1] = seq
        else:
            history.append({"role": role, "content": text})
            last.append(seq)
            previous = role
    return history, last


def open_transcript(sealer: Sealer, conversation: str, transcript: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """A copied sealed transcript (the input of turns started before inputs were references)
    as Messages-API history."""
    return open_entries(sealer, conversation, transcript)[0]


def history_of(sealer: Sealer, conversation: str, records: Sequence[Envelope],
               omitted_through: int = 0, opened: OpenedTexts | None = None
               ) -> tuple[list[dict[str, Any]], list[int]]:
    """The history a turn hands the model, from the records its input refers to: the
    summary (if any) leads the first message, then the messages and replies after it; and the
    last seq each history message holds. A turn whose older records were left out unsummarised
    is told so in the same place. ``opened``: as ``open_entries``."""
    return _history(_Read.of(sealer, conversation, records, opened), omitted_through)


class _Read:
    """A turn's records, opened: the summary's seq and text, if any, then the messages' and
    replies' roles, texts and seqs, in order.

    One pass over the records and one ``open_all`` for their blobs (the summary's among them):
    the entry dicts and a call per blob this replaces were ~7 % of the step thread's Python
    time at 60 turns a conversation (docs/benchmarks.md, issue 14, twenty-second pass)."""

    def __init__(self, stored: tuple[int, str] | None, roles: list[str], texts: list[str],
                 seqs: list[int]) -> None:
        self.stored, self.roles, self.texts, self.seqs = stored, roles, texts, seqs

    @classmethod
    def of(cls, sealer: Sealer, conversation: str, records: Sequence[Envelope],
           opened: OpenedTexts | None) -> _Read:
        summary: HistorySummarised | None = None
        blobs: list[tuple[str, Sealed]] = []
        roles: list[str] = []
        seqs: list[int] = []
        for env in records:
            rec = env.record
            if isinstance(rec, MessageRecorded):
                blobs.append((rec.message_id, rec.text))
                roles.append("user")
            elif isinstance(rec, ReplyRecorded):
                blobs.append((rec.reply_id, rec.text))
                roles.append("assistant")
            else:
                if isinstance(rec, HistorySummarised):
                    summary = rec
                continue
            seqs.append(env.seq)  # type: ignore[arg-type]  # a conversation record has its seq
        if summary is not None:
            blobs.append((summary.summary_id, summary.text))
        texts = _open_all(sealer, conversation, blobs, opened)
        stored = None if summary is None else (summary.through_seq, texts.pop())
        return cls(stored, roles, texts, seqs)


def _history(read: _Read, omitted_through: int) -> tuple[list[dict[str, Any]], list[int]]:
    history, last = _joined(read.texts, read.roles, read.seqs)
    return lead_with_stored(history, last, read.stored, omitted_through, READ_SETTING)


class Turns:
    """Runs turn workflows' step; starts those of conversations begun before their writer kept
    positions (keeping their transcript index)."""

    def __init__(self, publisher: Publisher, index: Any, sealer: Sealer, agent: ConcernAgent,
                 reader: LogReader, read_bytes: int, crash: CrashPoints | None = None) -> None:
        """``index`` is the table of ``TranscriptIndex`` values (of conversations begun
        before their writer kept positions); ``reader`` fetches the
        records a turn refers to; ``read_bytes`` is ``VOICE_HISTORY_READ_BYTES``; ``crash``
        the test-only crash points."""
        self.publisher = publisher
        self.index = index
        self.sealer = sealer
        self.agent = agent
        self.reader = reader
        self.read_bytes = read_bytes
        self.crash = crash or CrashPoints()
        self.opened = OpenedTexts(sealer)
        # A completed turn's step has recorded its end already: only a failed one has
        # bookkeeping left (``on_end``), so only it waits to be settled.
        self.definition = WorkflowDef(KIND, (StepDef("reply", self.reply_step),),
                                      on_end=self.on_end, on_end_when=("failed",),
                                      sealed_by=lambda i: i["conversation"],
                                      outcome_recorded=False)

    async def on_conversation_record(self, env: Envelope, partition: int, offset: int) -> None:
        """Told by the writer of each record it put at ``partition``/``offset``
        (``ctx.on_recorded``): start the workflow of each turn it opens in a
        conversation whose writer knows no positions (begun before it kept them; again on a
        redelivery: its start is idempotent), from the ``transcript_index`` table, which
        indexes that conversation as every conversation was before. A turn whose record names
        its history was started by its writer (``consumers.conversations.follow_ups``)."""
        rec = env.record
        if isinstance(rec, ConversationErased):
            self.index.pop(env.key, None)  # its key goes with its tombstone (docs/keys.md)
            self.opened.forget(env.key)
            return
        if isinstance(rec, TurnOpened) and rec.history is not None:
            return
        stored = self.index.get(env.key)
        legacy = isinstance(rec, (MessageRecorded, TurnRequested))  # of a table-kept log
        if stored is None and not legacy:
            return  # a reply or summary of a conversation whose writer keeps its positions
        index = TranscriptIndex.from_dict(stored)
        if isinstance(rec, TurnRequested):  # a log from before messages opened their turn
            await self._start(env, rec.conversation, rec.turn, rec.message_seq,
                              index.reference(rec.message_seq, partition))
        elif index.apply(env, partition, offset, self.read_bytes):
            self.index[env.key] = index.to_dict()
        if isinstance(rec, TurnOpened) and env.seq is not None:
            await self._start(env, rec.conversation, rec.turn, env.seq,
                              index.reference(env.seq, partition))

    async def _start(self, env: Envelope, conversation: str, turn: str, message_seq: int,
                     history: dict[str, Any]) -> None:
        await self.publisher.send(WORKFLOWS, turn_start(env, conversation, turn, message_seq,
                                                        history))

    async def read_history(self, conversation: str, inp: dict[str, Any]
                           ) -> tuple[list[dict[str, Any]], list[int]]:
        """The turn's history (and the last seq of each message), read from the log."""
        if "transcript" in inp:  # started before a turn's input became a reference
            return open_entries(self.sealer, conversation, inp["transcript"])
        ref = inp["history"]
        partition = int(ref["partition"])
        opening: Envelope | None = None  # the record that opened the turn, once read
        if "opened" in ref:  # the record that opened the turn names the positions
            at = Position.from_json(ref["opened"])
            [opening] = await self.reader.read(CONVERSATIONS, partition, conversation, [at])
            ref = reference_from(opening, partition, at.offset)  # (seq, offset) pairs
            positions = ref["entries"]
        else:  # an input naming the positions, as JSON gives them
            positions = [(int(p[0]), int(p[1])) for p in ref["entries"]]
        summary = [Position.from_json(ref["summary"])] if ref.get("summary") else []
        # What the conversation's last turn read (its key checked live first) is neither read
        # nor opened again: only the positions after it, and the summary.
        self.opened.check(conversation)
        last = self.opened.last_read(conversation)
        roles, texts = ([], []) if last is None else last.reuse(partition, positions)
        read = _Read.of(self.sealer, conversation, await self._records(
            conversation, partition, summary, positions[len(roles):], opening), self.opened)
        if len(roles) + len(read.roles) == len(positions):  # every position a message or reply
            read = _Read(read.stored, roles + read.roles, texts + read.texts,
                         [p[0] for p in positions])
            self.opened.keep_read(conversation, LastRead(partition, positions, read.roles,
                                                         read.texts))
        elif roles:  # a position that is no message or reply: all read, as a fresh read would
            read = _Read.of(self.sealer, conversation, await self._records(
                conversation, partition, summary, positions, opening), self.opened)
        return _history(read, ref.get("omitted_through") or 0)

    async def _records(self, conversation: str, partition: int, summary: list[Position],
                       positions: list[tuple[int, int]], opening: Envelope | None
                       ) -> list[Envelope]:
        """The records at ``summary`` then ``positions``; the last of them is ``opening``, not
        read again, when it is that record (the record that opened the turn is its own last
        position)."""
        last = opening if opening and positions and positions[-1][0] == opening.seq else None
        wanted = summary + [Position(*p) for p in (positions[:-1] if last else positions)]
        records = await self.reader.read(CONVERSATIONS, partition, conversation, wanted)
        return [*records, last] if last is not None else records

    async def reply_step(self, ctx: StepContext) -> dict[str, Any]:
        """Read and open the history, run the agent, submit summary, reply, proposal, state."""
        conversation, turn = ctx.input["conversation"], ctx.input["turn"]
        try:
            history, seqs = await self.read_history(conversation, ctx.input)
        except KeyErased:
            raise Erased("conversation", conversation) from None
        except LogUnavailable as exc:
            raise HistoryUnreadable(f"the history of turn {turn!r} cannot be read: {exc}",
                                    retryable=exc.retryable) from None
        if not history or history[-1]["role"] != "user":
            raise HistoryUnreadable(f"turn {turn!r} has no participant message (its history "
                                    f"holds {len(history)} messages, the last of seqs {seqs[-1:]})",
                                    retryable=False)
        tenant = ctx.input.get("tenant")
        reply = await self.agent(conversation, turn, ctx.attempt, history, ctx.cancel, tenant)
        summary = None
        if reply.summary is not None and 0 < reply.summary.summary_through <= len(seqs):
            summary_id = f"{turn}:summary"
            summary = HistorySummarised(
                conversation=conversation, turn=turn, summary_id=summary_id,
                through_seq=seqs[reply.summary.summary_through - 1],
                text=self.sealer.seal(conversation, summary_id, reply.summary.text))
        if reply.cancelled:
            await self._results(conversation, turn, tenant, self._ended(
                conversation, turn, "cancelled", f"the turn was {reply.cancelled}"), summary)
            return {"state": "CouldNotInterpret", "cancelled": True}
        if reply.could_not_interpret:
            # The model's words, which may quote the participant: sealed, never plain.
            await self._results(conversation, turn, tenant, self._ended(
                conversation, turn, "could_not_interpret",
                f"the agent could not interpret the message: {reply.could_not_interpret}"),
                summary)
            return {"state": "CouldNotInterpret"}
        reply_id = f"{turn}:reply"
        proposal = None
        if reply.proposal is not None:
            proposal_id = f"{turn}:proposal"
            proposal = ProposalRecorded(
                conversation=conversation, turn=turn, proposal_id=proposal_id,
                proposal=self.sealer.seal_json(conversation, proposal_id,
                                               reply.proposal.model_dump(mode="json")))
        await self._results(conversation, turn, tenant, TurnStateChanged(
            conversation=conversation, turn=turn, state="Replied"), summary,
            ReplyRecorded(conversation=conversation, turn=turn, reply_id=reply_id,
                          text=self.sealer.seal(conversation, reply_id, reply.text or "…")),
            proposal)
        self.crash.hit("after_reply", turn)
        return {"state": "Replied", "reply_id": reply_id,
                "proposal": reply.proposal is not None}

    async def on_end(self, state: WorkflowState) -> None:
        """A turn whose step failed after its attempts ends as CouldNotInterpret."""
        if state.status != "failed":
            return
        conversation, turn = state.input["conversation"], state.input["turn"]
        await self._results(conversation, turn, state.input.get("tenant"),
                            self._ended(conversation, turn, "step_failed",
                                        f"the turn failed after {state.attempt} attempts: "
                                        f"{failure_words(self.sealer, state)}"))

    def _ended(self, conversation: str, turn: str, code: str, words: str) -> TurnStateChanged:
        """A ``CouldNotInterpret`` end: ``code`` plain, ``words`` sealed with the
        conversation's key (an erased conversation keeps the code alone)."""
        try:
            sealed = seal_text(self.sealer, conversation, f"{turn}:reason", words)
        except KeyErased:
            sealed = None
        return TurnStateChanged(conversation=conversation, turn=turn, state="CouldNotInterpret",
                                reason_code=code, sealed_reason=sealed)

    async def _results(self, conversation: str, turn: str, tenant: str | None,
                       ended: TurnStateChanged, summary: HistorySummarised | None = None,
                       reply: ReplyRecorded | None = None,
                       proposal: ProposalRecorded | None = None) -> None:
        """Submit the turn's results as one command (``RecordTurnResults``, id
        ``{turn}:results``: a step re-run submits the same, which the closed turn refuses)."""
        record = RecordTurnResults(conversation=conversation, turn=turn, summary=summary,
                                   reply=reply, proposal=proposal, ended=ended)
        env = Envelope(record=record, key=conversation, source=SOURCE, subject=conversation,
                       tenant=tenant, correlation=turn, id=f"{turn}:results")
        await self.publisher.send(COMMANDS, env)
