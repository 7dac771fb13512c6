"""Views the edge derives from the conversation log (rebuilt from Kafka at every start: all of
it, or with ``VOICE_EDGE_HISTORY_S`` the recent part, older conversations read when asked for).

A ``ConversationView`` is a ``KeptEvents`` of ``api.frame.projection``: records apply in log
order and are deduped by seq, and the last ``kept`` records (any type) are kept for SSE resume
(``id:`` = seq). Besides, per conversation: its content records (messages, replies, proposals)
by seq, for the transcript and turns, and each turn's state, reason, reply and proposal.

Content stays sealed here; routes open it for the owner (``api.conversations.render``).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from api.frame.on_demand import OnDemandViews
from api.frame.projection import Caller, KeptEvents
from schemas.base import registry
from schemas.conversation import (
    ConversationErased,
    ConversationStarted,
    MessageRecorded,
    ProposalRecorded,
    ReplyDelta,
    ReplyRecorded,
    TurnOpened,
    TurnRequested,
    TurnState,
    TurnStateChanged,
)
from streams.envelope import Envelope, unfolded
from streams.ids import CLOCK_SLACK_MS, parse_turn

CONTENT = (MessageRecorded, ReplyRecorded, ProposalRecorded)
"""The records of a transcript (``ConversationView.content``): messages, replies, proposals."""
COLD_PAGE_SEQS = 6
"""Seqs read from the log for each record an older transcript page asks for (a turn is 4–6
seqs and holds 1–3 of them)."""


@dataclass(slots=True)
class TurnView:
    turn: str
    message_seq: int
    state: TurnState | None = None
    ended: TurnStateChanged | None = None
    """The turn's latest state record: its reason's code plain, its words sealed."""
    reply: Envelope | None = None
    """The turn's ``ReplyRecorded`` (sealed), while the view holds it (``reply_seq``)."""
    proposal: Envelope | None = None
    """The turn's ``ProposalRecorded`` (sealed), while the view holds it."""
    reply_seq: int | None = None
    """Where its reply is on the log, once recorded (held or not)."""
    proposal_seq: int | None = None
    """Where its proposal is on the log, once recorded (held or not)."""


@dataclass(kw_only=True)
class ConversationView(KeptEvents[Envelope]):
    conversation: str
    owner: str
    first_seen: int = 0
    """Seq of the first record this edge saw (above 1 if retention trimmed the log)."""
    erased: bool = False
    content: dict[int, Envelope] = field(default_factory=dict)
    """Messages, replies and proposals by seq (sealed)."""
    turns: dict[str, TurnView] = field(default_factory=dict)
    held_from: int = 0
    """Content below this seq is no longer held here (``trim``): read from the log."""
    marks: list[tuple[int, int]] = field(default_factory=list)
    """(seq, its record's time in ms) at each ``trim``: where a read of older seqs may start
    in the log (``since_ms``), not at the conversation's first record."""

    @property
    def stream_name(self) -> str:
        return self.conversation

    @staticmethod
    def cursor_of(event: Envelope) -> int:
        assert event.seq is not None
        return event.seq

    def owned_by(self, owner: str) -> bool:
        return self.owner == owner and not self.erased

    def end_live(self, turn: str) -> None:
        """Forget ``turn``'s transient events (its reply as written): the log completed it.
        Nothing is built when none are held, the usual case (every turn's end comes here)."""
        if self.live:
            self.drop_live(lambda d: d.record.turn == turn)

    def turn(self, turn: str) -> TurnView:
        tv = self.turns.get(turn)
        if tv is None:
            parsed = parse_turn(turn)
            tv = TurnView(turn=turn, message_seq=parsed[1] if parsed else 0)
            self.turns[turn] = tv
        return tv

    def page(self, before: int | None, limit: int) -> tuple[list[tuple[int, Envelope]], int | None]:
        """The newest ``limit`` content records it holds with a seq below ``before`` (any seq
        when None), oldest first, and the seq to page back from (the ``before`` of the next
        older page) — ``held_from`` when the older ones are only on the log, None when there
        are none. The work is the records skipped and taken, never the whole transcript
        (``content`` is in seq order: records apply in it)."""
        picked: list[tuple[int, Envelope]] = []
        for seq in reversed(self.content):
            if before is not None and seq >= before:
                continue
            if len(picked) == limit:
                picked.reverse()
                return picked, picked[0][0]
            picked.append((seq, self.content[seq]))
        picked.reverse()
        return picked, self.held_from if self.held_from > 1 else None

    def trim(self) -> None:
        """Hold content only for the events kept (``kept``): a long conversation's older
        messages, replies and proposals are read from the log when asked for, and its ended
        turns keep their state and where their reply and proposal are, not the records.
        Trimmed in steps of a tenth of ``kept`` (each step looks at every turn)."""
        if not self.events:
            return
        first = self.events[0]
        oldest = self.cursor_of(first)
        if oldest - self.held_from < max(1, self.kept // 10):
            return
        self.held_from = oldest
        self.marks.append((oldest, int(first.time.timestamp() * 1000)))
        for seq in [s for s in self.content if s < oldest]:  # the oldest first: a prefix
            del self.content[seq]
        for tv in self.turns.values():
            if tv.reply is not None and tv.reply_seq is not None and tv.reply_seq < oldest:
                tv.reply = None
            if (tv.proposal is not None and tv.proposal_seq is not None
                    and tv.proposal_seq < oldest):
                tv.proposal = None
            ended = tv.ended
            if (ended is not None and ended.state == "Replied" and tv.reply is None
                    and ended.reason is None and ended.sealed_reason is None
                    and ended.reason_code is None):
                tv.ended = None  # says nothing its state does not: ~0.5 KiB a turn

    def since_ms(self, after: int) -> int | None:
        """Where in time a read of the seqs after ``after`` may start: the time of the latest
        mark at or before them (a folded record that holds them included) less the clocks'
        slack; None when no mark is that old (from the conversation's first record)."""
        at = bisect_right(self.marks, (after - FOLDED_SEQS + 1, math.inf)) - 1
        return None if at < 0 else max(0, self.marks[at][1] - CLOCK_SLACK_MS)

    def forget(self) -> None:
        """Drop everything but identity: the conversation is erased."""
        self.erased = True
        self.events.clear()
        self.rendered.clear()
        self.live.clear()
        self.content.clear()
        self.turns.clear()


FOLDED_SEQS = max(t.seqs for t in registry().values()) - 1
"""The most seqs a record holds after its own (a folded record's)."""


def _slim(env: Envelope) -> Envelope:
    """``env`` without what no reader of the edge uses: the positions a ``TurnOpened`` names
    for its turn's step (up to 1,000 pairs, ~120 KB decoded). Kept with every message of a
    long conversation, they made its view on every edge grow with the square of its length
    (~43 MB at 600 turns: docs/benchmarks.md, issue 14, twenty-fourth pass)."""
    rec = env.record
    if isinstance(rec, TurnOpened) and rec.history is not None:
        return replace(env, record=rec.model_copy(update={"history": None}))
    return env


class ConversationViews(OnDemandViews[ConversationView]):
    """Every conversation this edge has seen, by id and by owner.

    With a ``cold`` reader (``VOICE_EDGE_HISTORY_S``), the tail starts inside the log, and
    this holds only the conversations in use (``api.frame.on_demand``; decision 0011); with a
    ``gap`` reader, events older than a view keeps are read from the log too.
    """

    FOUNDED_BY = ConversationStarted
    FOLDED_BACK = FOLDED_SEQS
    POSITION = "seq"

    @staticmethod
    def positions(env: Envelope) -> Iterator[tuple[int, Envelope]]:
        """Each seq a record holds (a folded one holds several), with its record."""
        return ((part.seq, part) for part in unfolded(env) if part.seq is not None)

    async def older_page(self, view: ConversationView, before: int, limit: int
                         ) -> tuple[list[tuple[int, Envelope]], int | None]:
        """``ConversationView.page`` for a page below what ``view`` holds (``before`` at or
        under its ``held_from``): read from the log, ``COLD_PAGE_SEQS`` seqs a record — so a
        page may hold fewer than ``limit``; ``older`` then says where to go on.
        ``ColdReadFailed`` when the log cannot give them."""
        upto = before - 1
        after = max(view.first_seen - 1, upto - COLD_PAGE_SEQS * limit, 0)
        if upto <= after:
            return [], None
        found = await self.older(view.conversation, after, upto, share=False,
                                 since_ms=view.since_ms(after))
        page = [(env.seq, env) for env in found
                if env.seq is not None and isinstance(env.record, CONTENT)]
        if len(page) > limit:
            page = page[-limit:]
            return page, page[0][0]
        return page, after + 1 if after > max(view.first_seen - 1, 0) else None

    async def with_records(self, view: ConversationView, tv: TurnView) -> TurnView:
        """``tv`` with its reply and proposal, read from the log when ``view`` no longer
        holds them — in one read, from the first to the last (``ColdReadFailed`` when it
        cannot)."""
        wanted = [seq for env, seq in ((tv.reply, tv.reply_seq),
                                       (tv.proposal, tv.proposal_seq))
                  if env is None and seq is not None]
        if not wanted:
            return tv
        after = min(wanted) - 1
        found = {env.seq: env for env in await self.older(
            view.conversation, after, max(wanted), share=False, since_ms=view.since_ms(after))}
        return replace(tv, reply=tv.reply or found.get(tv.reply_seq),
                       proposal=tv.proposal or found.get(tv.proposal_seq))

    def apply(self, env: Envelope) -> ConversationView | None:
        """Apply one record of the log — a folded one as the records it stands for, each at
        its seq (``streams.envelope.unfolded``); returns the view it changed, or None for a
        duplicate/unknown. A ``TurnOpened`` is kept without the positions it names (``_slim``)."""
        if env.record.seqs == 1:
            return self._apply(env)
        env = _slim(env)
        changed = None
        for part in unfolded(env):
            changed = self._apply(part) or changed
        return changed

    def _apply(self, env: Envelope) -> ConversationView | None:
        rec = env.record
        if isinstance(rec, ConversationStarted):
            if env.key in self.by_key:
                return None
            view = ConversationView(conversation=env.key, owner=rec.owner, tenant=env.tenant,
                                    kept=self.kept)
            self.by_key[env.key] = view
        else:
            view = self.by_key.get(env.key)
            if view is None:
                self.held_back(env.key, env)
                return None
        if not view.accept(env):
            return None
        view.used_at = time.monotonic()
        if not view.first_seen:
            view.first_seen = view.last_seq
        if isinstance(rec, ConversationErased):
            view.forget()
        elif not view.erased:
            self._record(view, env)
        self.notify(env.key)
        return view

    def _record(self, view: ConversationView, env: Envelope) -> None:
        view.keep(env)
        rec = env.record
        assert env.seq is not None
        if isinstance(rec, MessageRecorded):
            view.content[env.seq] = env
        elif isinstance(rec, TurnRequested):
            view.turn(rec.turn).message_seq = rec.message_seq
        elif isinstance(rec, TurnStateChanged):
            tv = view.turn(rec.turn)
            tv.state, tv.ended = rec.state, rec
            if rec.state != "Thinking":
                view.end_live(rec.turn)
        elif isinstance(rec, ReplyRecorded):
            view.content[env.seq] = env
            tv = view.turn(rec.turn)
            tv.reply, tv.reply_seq = env, env.seq
            view.end_live(rec.turn)
        elif isinstance(rec, ProposalRecorded):
            view.content[env.seq] = env
            tv = view.turn(rec.turn)
            tv.proposal, tv.proposal_seq = env, env.seq
        if self.gap is not None:  # older content can be read from the log
            view.trim()

    def apply_delta(self, env: Envelope) -> None:
        """Hold a turn's streamed reply text (``voice.deltas``) for the conversation's live
        streams, until the log completes the turn; a delta for a turn already complete, of an
        unknown or erased conversation or of another tenant is dropped."""
        rec = env.record
        view = self.by_key.get(env.key)
        if (not isinstance(rec, ReplyDelta) or view is None or view.erased
                or env.tenant != view.tenant or rec.conversation != view.conversation):
            return
        tv = view.turns.get(rec.turn)
        if tv is not None and (tv.reply_seq is not None or tv.state not in (None, "Thinking")):
            return
        view.add_live(env)
        self.notify(env.key)

    def mark_erased(self, conversation: str) -> None:
        """Forget a conversation's content now (its key is gone), before the log says so."""
        view = self.by_key.get(conversation)
        if view is not None and not view.erased:
            view.forget()
            self.notify(conversation)

    def list_for(self, who: Caller) -> list[ConversationView]:
        """The conversations ``who`` owns in its tenant."""
        return [v for v in self.by_key.values() if v.tenant == who.tenant and v.owned_by(who.sub)]
