"""What the edge derives from ``voice.assistant`` and ``voice.datasets`` (rebuilt at start).

- Datasets: owner, counts, sealed metadata and the record's position (partition, offset), which
  a chat turn hands to the worker so it can fetch exactly that record.
- Assistant conversations: owner, the last ``kept`` display events by ``display_seq`` (sealed,
  for SSE resume), each turn's state and reply, and the turn in progress.

Records are applied in log order and deduped by seq (conversations) or id (datasets). Waiters
are woken on every change of their key, so streams wait for events without polling. Everything
runs on the edge's event loop (the tail hands records over with ``call_soon_threadsafe``).
Also here: the display-event SSE stream that the chat route and the resume route share.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from fastapi.sse import ServerSentEvent

from api.changes import Changes
from api.views import CursorTooOld
from schemas.assistant import (
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    DatasetRecorded,
    DisplayPayload,
)
from schemas.base import Sealed
from streams.assistant_settings import AssistantSettings
from streams.envelope import Envelope
from streams.sealing import Sealer
from streams.topics import ASSISTANT, DATASETS, TopicSpec

KEEPALIVE_S = 5.0
END_MARGIN_S = 1.0
OPTIONAL = ("group_id", "parent_id", "display_id")


@dataclass
class DatasetView:
    dataset_id: str
    owner: str
    rows: int
    columns: int
    meta: Sealed
    partition: int
    offset: int


@dataclass
class AssistantTurnView:
    turn: str
    state: str = "Thinking"
    reply: AssistantReplyRecorded | None = None
    end_reason: str | None = None
    reason: str | None = None


@dataclass
class AssistantConversationView:
    conversation: str
    owner: str
    kept: int
    last_seq: int = 0
    display_seq: int = 0
    running: str | None = None
    events: deque[tuple[int, DisplayPayload]] = field(default_factory=deque)
    turns: dict[str, AssistantTurnView] = field(default_factory=dict)

    def oldest_cursor(self) -> int:
        """The smallest ``after`` whose every later event this view still keeps."""
        return self.events[0][0] - 1 if self.events else self.display_seq

    def events_after(self, cursor: int) -> list[tuple[int, DisplayPayload]]:
        oldest = self.oldest_cursor()
        if cursor < oldest:
            raise CursorTooOld(self.conversation, cursor, oldest)
        if cursor >= self.display_seq:
            return []
        start = max(0, len(self.events) - (self.display_seq - cursor))  # display seqs are dense
        return [e for e in islice(self.events, start, None) if e[0] > cursor]


class AssistantViews:
    """Every assistant conversation and dataset this edge has seen."""

    def __init__(self, settings: AssistantSettings) -> None:
        self.settings = settings
        self.kept = settings.edge_events_kept
        self.conversations: dict[str, AssistantConversationView] = {}
        self.datasets: dict[str, DatasetView] = {}
        self._changes = Changes()

    def tail_handlers(self) -> dict[TopicSpec, Callable[[Envelope, int, int], None]]:
        """What the edge's tail feeds (``EdgeTail(located=…)``)."""
        return {ASSISTANT: lambda env, _p, _o: self.apply(env), DATASETS: self.apply_dataset}

    # --- datasets ------------------------------------------------------------------------------

    def apply_dataset(self, env: Envelope, partition: int, offset: int) -> None:
        rec = env.record
        if isinstance(rec, DatasetRecorded) and rec.dataset_id not in self.datasets:
            self.datasets[rec.dataset_id] = DatasetView(rec.dataset_id, rec.owner, rec.rows,
                                                        rec.columns, rec.meta, partition, offset)
            self._notify(f"ds:{rec.dataset_id}")

    def dataset(self, dataset_id: str, owner: str) -> DatasetView | None:
        """The dataset if ``owner`` uploaded it (else None: 404, whoever's it is)."""
        ds = self.datasets.get(dataset_id)
        return ds if ds is not None and ds.owner == owner else None

    # --- conversations -------------------------------------------------------------------------

    def apply(self, env: Envelope) -> None:
        rec = env.record
        if isinstance(rec, AssistantConversationStarted):
            if env.key in self.conversations:
                return
            view = AssistantConversationView(env.key, rec.owner, self.kept)
            self.conversations[env.key] = view
        else:
            view = self.conversations.get(env.key)
            if view is None:
                return
        if env.seq is None or env.seq <= view.last_seq:
            return
        view.last_seq = env.seq
        if isinstance(rec, AssistantTurnRequested):
            view.turns[rec.turn] = AssistantTurnView(rec.turn)
            view.running = rec.turn
        elif isinstance(rec, AssistantDisplayRecorded):
            view.display_seq = rec.display_seq
            view.events.append((rec.display_seq, rec.event))
            while len(view.events) > view.kept:
                view.events.popleft()
        elif isinstance(rec, AssistantReplyRecorded):
            view.turns.setdefault(rec.turn, AssistantTurnView(rec.turn)).reply = rec
        elif isinstance(rec, AssistantTurnEnded):
            tv = view.turns.setdefault(rec.turn, AssistantTurnView(rec.turn))
            tv.state, tv.end_reason, tv.reason = rec.state, rec.end_reason, rec.reason
            if view.running == rec.turn:
                view.running = None
        self._notify(env.key)

    def owned(self, conversation: str, owner: str) -> AssistantConversationView | None:
        view = self.conversations.get(conversation)
        return view if view is not None and view.owner == owner else None

    # --- waiting ---------------------------------------------------------------------------

    def _notify(self, key: str) -> None:
        self._changes.notify(key)

    async def wait(self, key: str, until: Callable[[], bool], timeout: float) -> bool:
        """Wait at most ``timeout`` s until ``until()`` holds (re-checked on every change of
        ``key``: a conversation id, or ``ds:<dataset id>``); returns whether it does."""
        return await self._changes.wait(key, until, timeout)


def _ended(view: AssistantConversationView, turn: str) -> bool:
    tv = view.turns.get(turn)
    return tv is not None and tv.state != "Thinking"


def display_event(sealer: Sealer, conversation: str, payload: DisplayPayload) -> dict[str, Any]:
    """The engine's display event as its owner sees it (data opened)."""
    out: dict[str, Any] = {
        "id": payload.event_id, "type": payload.type, "channel": payload.channel,
        "scope": payload.scope, "message_id": payload.message_id, "verb": payload.verb,
        "priority": payload.priority,
        "data": sealer.open_json(conversation, f"{payload.event_id}/data", payload.data),
        "persistent": payload.persistent, "ts": payload.ts}
    for name in OPTIONAL:
        if getattr(payload, name) is not None:
            out[name] = getattr(payload, name)
    if payload.metadata:
        out["metadata"] = payload.metadata
    return out


async def display_stream(views: AssistantViews, sealer: Sealer, conversation: str,
                         cursor: int, bound_s: float, until_done: str | None = None
                         ) -> AsyncIterator[ServerSentEvent]:
    """The conversation's display events after ``cursor`` (``id:`` = display seq), then live
    ones. Ends after ``until_done``'s ``done`` event when given, else once nothing runs and
    all is sent; always before the gateway bound, with a comment saying where to resume.
    Keep-alive comments carry no id."""
    loop = asyncio.get_running_loop()
    end_at = loop.time() + bound_s - min(END_MARGIN_S, bound_s / 3)
    keepalive = min(KEEPALIVE_S, bound_s / 3)
    last_sent = loop.time()
    while True:
        view = views.conversations.get(conversation)
        if view is None:
            yield ServerSentEvent(comment="end; no such conversation")
            return
        try:
            events = view.events_after(cursor)
        except CursorTooOld as exc:
            yield ServerSentEvent(comment=f"end; cursor {cursor} is too old, the oldest this "
                                          f"edge serves is {exc.oldest}")
            return
        for seq, payload in events:
            if loop.time() >= end_at:
                break
            yield ServerSentEvent(event="display", id=str(seq),
                                  data=display_event(sealer, conversation, payload))
            cursor, last_sent = seq, loop.time()
            if until_done is not None and payload.type == "done" \
                    and payload.message_id == until_done:
                yield ServerSentEvent(comment=f"end; turn done; resume with after={cursor}")
                return
        now = loop.time()
        if now >= end_at:
            break
        if cursor >= view.display_seq and (
                (until_done is None and view.running is None)
                or (until_done is not None and _ended(view, until_done))):
            yield ServerSentEvent(comment=f"end; idle; resume with after={cursor}")
            return
        if now - last_sent >= keepalive:
            yield ServerSentEvent(comment="keep-alive")
            last_sent = now

        def moved(c: int = cursor) -> bool:
            v = views.conversations.get(conversation)
            if v is None or v.display_seq > c:
                return True
            return v.running is None if until_done is None else _ended(v, until_done)

        await views.wait(conversation, moved,
                         max(0.0, min(end_at, last_sent + keepalive) - now))
    yield ServerSentEvent(comment=f"end; reconnect with after={cursor}")
