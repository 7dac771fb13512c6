"""Views the edge derives from the conversation log (rebuilt from Kafka at every start).

Records are applied in log order per conversation and deduped by seq: a record whose seq is
not above the conversation's last seen seq is a redelivery and changes nothing.

Per conversation a view keeps:

- the last ``kept`` records (any type) for SSE resume; a cursor older than the oldest kept one
  (or older than the first record this edge ever saw, if retention trimmed the log) raises
  ``CursorTooOld`` naming the oldest cursor it can serve;
- its content records (messages, replies, proposals) by seq, for the transcript and turns;
- each turn's state, reason, reply and proposal.

Content stays sealed here; routes open it for the owner (``api.render``). Waiters
(``wait``) are woken on every change of their conversation, so streams and reads that must see
a seq can wait for it without polling. Everything runs on the edge's event loop (the tail hands
records over with ``call_soon_threadsafe``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice

from api.changes import Changes
from schemas.conversation import (
    ConversationErased,
    ConversationStarted,
    MessageRecorded,
    ProposalRecorded,
    ReplyRecorded,
    TurnRequested,
    TurnState,
    TurnStateChanged,
)
from streams.envelope import Envelope
from streams.ids import parse_turn

DEFAULT_KEPT = 10_000


class CursorTooOld(Exception):
    """The events after ``cursor`` are no longer all kept; ``oldest`` is the oldest cursor
    that can still be served."""

    def __init__(self, conversation: str, cursor: int, oldest: int) -> None:
        super().__init__(f"cursor {cursor} of {conversation} is older than this edge keeps; "
                         f"the oldest cursor it can serve is {oldest}")
        self.conversation = conversation
        self.cursor = cursor
        self.oldest = oldest


@dataclass
class TurnView:
    turn: str
    message_seq: int
    state: TurnState | None = None
    reason: str | None = None
    reply: Envelope | None = None
    """The turn's ``ReplyRecorded`` (sealed), once recorded."""
    proposal: Envelope | None = None
    """The turn's ``ProposalRecorded`` (sealed), once recorded."""


@dataclass
class ConversationView:
    conversation: str
    owner: str
    kept: int = DEFAULT_KEPT
    first_seen: int = 0
    """Seq of the first record this edge saw (above 1 if retention trimmed the log)."""
    last_seq: int = 0
    erased: bool = False
    events: deque[Envelope] = field(default_factory=deque)
    """The last ``kept`` records, in seq order."""
    content: dict[int, Envelope] = field(default_factory=dict)
    """Messages, replies and proposals by seq (sealed)."""
    turns: dict[str, TurnView] = field(default_factory=dict)

    def oldest_cursor(self) -> int:
        """The smallest ``after`` this view can serve every later event for."""
        return self.events[0].seq - 1 if self.events else self.last_seq  # type: ignore[operator]

    def events_after(self, cursor: int) -> list[Envelope]:
        """Every kept record with seq above ``cursor``, in order; ``CursorTooOld`` when some
        of them are no longer kept."""
        oldest = self.oldest_cursor()
        if cursor < oldest:
            raise CursorTooOld(self.conversation, cursor, oldest)
        if cursor >= self.last_seq:
            return []
        # Seqs are dense, so the first wanted record sits at a known distance from the end.
        start = max(0, len(self.events) - (self.last_seq - cursor))
        return [e for e in islice(self.events, start, None) if e.seq is not None and e.seq > cursor]

    def turn(self, turn: str) -> TurnView:
        tv = self.turns.get(turn)
        if tv is None:
            parsed = parse_turn(turn)
            tv = TurnView(turn=turn, message_seq=parsed[1] if parsed else 0)
            self.turns[turn] = tv
        return tv

    def forget(self) -> None:
        """Drop everything but identity: the conversation is erased."""
        self.erased = True
        self.events.clear()
        self.content.clear()
        self.turns.clear()


class ConversationViews:
    """Every conversation this edge has seen, by id and by owner."""

    def __init__(self, kept: int = DEFAULT_KEPT) -> None:
        if kept < 1:
            raise ValueError("kept must be at least 1")
        self.kept = kept
        self.by_id: dict[str, ConversationView] = {}
        self._changes = Changes()

    def apply(self, env: Envelope) -> ConversationView | None:
        """Apply one record; returns the view it changed, or None for a duplicate/unknown."""
        rec = env.record
        if isinstance(rec, ConversationStarted):
            if env.key in self.by_id:
                return None
            view = ConversationView(conversation=env.key, owner=rec.owner, kept=self.kept)
            self.by_id[env.key] = view
        else:
            view = self.by_id.get(env.key)
            if view is None:
                return None
        if env.seq is None or env.seq <= view.last_seq:
            return None
        if not view.first_seen:
            view.first_seen = env.seq
        view.last_seq = env.seq
        if isinstance(rec, ConversationErased):
            view.forget()
        elif not view.erased:
            self._record(view, env)
        self._notify(env.key)
        return view

    def _record(self, view: ConversationView, env: Envelope) -> None:
        view.events.append(env)
        while len(view.events) > view.kept:
            view.events.popleft()
        rec = env.record
        assert env.seq is not None
        if isinstance(rec, MessageRecorded):
            view.content[env.seq] = env
        elif isinstance(rec, TurnRequested):
            view.turn(rec.turn).message_seq = rec.message_seq
        elif isinstance(rec, TurnStateChanged):
            tv = view.turn(rec.turn)
            tv.state, tv.reason = rec.state, rec.reason
        elif isinstance(rec, ReplyRecorded):
            view.content[env.seq] = env
            view.turn(rec.turn).reply = env
        elif isinstance(rec, ProposalRecorded):
            view.content[env.seq] = env
            view.turn(rec.turn).proposal = env

    def mark_erased(self, conversation: str) -> None:
        """Forget a conversation's content now (its key is gone), before the log says so."""
        view = self.by_id.get(conversation)
        if view is not None and not view.erased:
            view.forget()
            self._notify(conversation)

    def owned(self, conversation: str, owner: str) -> ConversationView | None:
        """The conversation if ``owner`` owns it and it is not erased (else None → 404)."""
        view = self.by_id.get(conversation)
        if view is None or view.erased or view.owner != owner:
            return None
        return view

    def list_for(self, owner: str) -> list[ConversationView]:
        return [v for v in self.by_id.values() if v.owner == owner and not v.erased]

    # --- waiting for the log to reach a point ----------------------------------------------

    def _notify(self, conversation: str) -> None:
        self._changes.notify(conversation)

    async def wait(self, conversation: str,
                   until: Callable[[ConversationView | None], bool], timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until ``until(view)`` holds; returns whether it does.

        ``until`` is re-checked after every change of the conversation (and at the start).
        """
        return await self._changes.wait(
            conversation, lambda: until(self.by_id.get(conversation)), timeout)

    def waiting(self, conversation: str) -> int:
        """How many waiters a conversation has (for tests and diagnostics)."""
        return self._changes.waiting(conversation)
