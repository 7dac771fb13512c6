"""What the edge derives from ``voice.assistant`` and ``voice.datasets`` (rebuilt at start: all
of ``voice.assistant``, or with ``VOICE_EDGE_HISTORY_S`` the recent part, older conversations
read when asked for).

- Datasets: owner, counts, sealed metadata and the record's position (partition, offset), which
  a chat turn hands to the worker so it can fetch exactly that record. Deduped by id. An erased
  one (``DatasetErased``) keeps its identity only, and is nobody's.
- Assistant conversations: ``KeptEvents`` of ``api.frame.projection`` whose cursor is the
  display seq (the SSE ``id:``): records are deduped by the conversation's seq, the last
  ``kept`` display records are kept (sealed) for resume, older ones read from the log for an
  old cursor (``OnDemandViews.older``); besides, each turn's state and reply,
  and the turn in progress. An erased one (``AssistantConversationErased``, or this edge's
  own erasure before the log says so) keeps its identity only, and is nobody's.

Also here: how a display event looks to its owner (``display_event``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.frame.on_demand import ColdGap, ColdRead, OnDemandViews
from api.frame.projection import AggregateView, KeptEvents, Projection
from schemas.assistant import (
    AssistantConversationErased,
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    DatasetErased,
    DatasetRecorded,
    DisplayPayload,
    ImageRecorded,
)
from schemas.base import Sealed
from streams.assistant_settings import AssistantSettings
from streams.envelope import Envelope
from streams.sealing import Sealer
from streams.topics import ASSISTANT, DATASETS, TopicSpec

OPTIONAL = ("group_id", "parent_id", "display_id")


@dataclass(kw_only=True)
class DatasetView(AggregateView):
    dataset_id: str
    owner: str
    rows: int
    columns: int
    meta: Sealed
    partition: int
    offset: int
    namespace: str | None = None
    media_type: str | None = None
    """Set for an uploaded image (``ImageRecorded``; no rows or columns), ``None`` for a CSV."""
    erased: bool = False

    def owned_by(self, owner: str) -> bool:
        return self.owner == owner and not self.erased


@dataclass
class AssistantTurnView:
    turn: str
    state: str = "Thinking"
    reply: AssistantReplyRecorded | None = None
    end_reason: str | None = None
    ended: AssistantTurnEnded | None = None
    """The turn's end record: its reason's code plain, its words sealed."""


@dataclass(kw_only=True)
class AssistantConversationView(KeptEvents[AssistantDisplayRecorded]):
    conversation: str
    owner: str
    display_seq: int = 0
    running: str | None = None
    turns: dict[str, AssistantTurnView] = field(default_factory=dict)
    erased: bool = False

    @property
    def stream_name(self) -> str:
        return self.conversation

    @staticmethod
    def cursor_of(event: AssistantDisplayRecorded) -> int:
        return event.display_seq

    def head(self) -> int:
        return self.display_seq

    def owned_by(self, owner: str) -> bool:
        return self.owner == owner and not self.erased

    def forget(self) -> None:
        """Drop everything but identity: the conversation is erased."""
        self.erased, self.running = True, None
        self.events.clear()
        self.live.clear()
        self.turns.clear()

    def ended(self, turn: str) -> bool:
        """Whether ``turn`` has ended (replied, failed or cancelled)."""
        tv = self.turns.get(turn)
        return tv is not None and tv.state != "Thinking"


class Datasets(Projection[DatasetView]):
    """Every dataset and image uploaded through any edge, by id."""

    def apply(self, env: Envelope, partition: int, offset: int) -> None:
        rec = env.record
        if isinstance(rec, DatasetErased):
            # Compaction may have kept only the erasure: then there is nothing to forget.
            self.mark_erased(rec.dataset_id)
            return
        if isinstance(rec, ImageRecorded) and rec.image_id not in self.by_key:
            self.by_key[rec.image_id] = DatasetView(
                dataset_id=rec.image_id, owner=rec.owner, tenant=env.tenant, rows=0, columns=0,
                meta=rec.meta, partition=partition, offset=offset, namespace=rec.namespace,
                media_type=rec.media_type)
            self.notify(rec.image_id)
            return
        if isinstance(rec, DatasetRecorded) and rec.dataset_id not in self.by_key:
            self.by_key[rec.dataset_id] = DatasetView(
                dataset_id=rec.dataset_id, owner=rec.owner, tenant=env.tenant, rows=rec.rows,
                columns=rec.columns,
                meta=rec.meta, partition=partition, offset=offset, namespace=rec.namespace)
            self.notify(rec.dataset_id)

    def mark_erased(self, dataset_id: str) -> None:
        """Forget a dataset's content now (its key is gone), before the log says so."""
        view = self.by_key.get(dataset_id)
        if view is not None and not view.erased:
            view.erased = True
            self.notify(dataset_id)


class AssistantConversations(OnDemandViews[AssistantConversationView]):
    """Every assistant conversation this edge has seen, by id — with a ``cold`` reader
    (``VOICE_EDGE_HISTORY_S``), those in use: older ones are read from the log when asked
    for (``api.frame.on_demand``; decision 0011)."""

    FOUNDED_BY = AssistantConversationStarted
    POSITION = "display seq"

    @staticmethod
    def positions(env: Envelope) -> list[tuple[int, Envelope]]:
        """A display event's display seq (a stream's cursor), with its record; none for any
        other record."""
        at = display_seq_of(env)
        return [] if at is None else [(at, env)]

    def apply(self, env: Envelope) -> None:
        rec = env.record
        if isinstance(rec, AssistantConversationStarted):
            if env.key in self.by_key:
                return
            view = AssistantConversationView(conversation=env.key, owner=rec.owner,
                                             tenant=env.tenant, kept=self.kept)
            self.by_key[env.key] = view
        else:
            view = self.by_key.get(env.key)
            if view is None:
                self.held_back(env.key, env)
                return
        if not view.accept(env):
            return
        view.used_at = time.monotonic()
        if isinstance(rec, AssistantConversationErased):
            view.forget()
        elif view.erased:
            pass  # nothing of it is kept (the sequencer appends nothing after the erasure)
        elif isinstance(rec, AssistantTurnRequested):
            view.turns[rec.turn] = AssistantTurnView(rec.turn)
            view.running = rec.turn
        elif isinstance(rec, AssistantDisplayRecorded):
            view.display_seq = rec.display_seq
            view.keep(rec)
        elif isinstance(rec, AssistantReplyRecorded):
            view.turns.setdefault(rec.turn, AssistantTurnView(rec.turn)).reply = rec
        elif isinstance(rec, AssistantTurnEnded):
            tv = view.turns.setdefault(rec.turn, AssistantTurnView(rec.turn))
            tv.state, tv.end_reason, tv.ended = rec.state, rec.end_reason, rec
            if view.running == rec.turn:
                view.running = None
        self.notify(env.key)

    def mark_erased(self, conversation: str) -> None:
        """Forget a conversation's content now (its key is gone), before the log says so."""
        view = self.by_key.get(conversation)
        if view is not None and not view.erased:
            view.forget()
            self.notify(conversation)


class AssistantViews:
    """Every assistant conversation and dataset this edge has seen."""

    def __init__(self, settings: AssistantSettings, cold: ColdRead | None = None,
                 gap: ColdGap | None = None) -> None:
        self.settings = settings
        self.conversations = AssistantConversations(settings.edge_events_kept, cold, gap)
        self.datasets = Datasets()

    def tail_handlers(self) -> dict[TopicSpec, Callable[[Envelope, int, int], None]]:
        """What the edge's tail feeds (``EdgeTail(located=…)``)."""
        return {ASSISTANT: lambda env, _p, _o: self.conversations.apply(env),
                DATASETS: self.datasets.apply}


def display_seq_of(env: Envelope) -> int | None:
    """A chat record's position in its display stream: a display event's display seq."""
    rec = env.record
    return rec.display_seq if isinstance(rec, AssistantDisplayRecorded) else None


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
