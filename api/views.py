"""Views the edge derives from the conversation log (rebuilt from Kafka at every start).

Records are applied in log order per conversation and deduped by seq: a record whose seq is
not above the conversation's last seen seq is a redelivery and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.conversation import ConversationErased, ConversationStarted
from streams.envelope import Envelope


@dataclass
class ConversationView:
    conversation: str
    owner: str
    last_seq: int = 0
    erased: bool = False
    events: list[Envelope] = field(default_factory=list)


class ConversationViews:
    """Every conversation this edge has seen, by id and by owner."""

    def __init__(self) -> None:
        self.by_id: dict[str, ConversationView] = {}

    def apply(self, env: Envelope) -> ConversationView | None:
        """Apply one record; returns the view it changed, or None for a duplicate/unknown."""
        rec = env.record
        if isinstance(rec, ConversationStarted):
            if env.key in self.by_id:
                return None
            view = ConversationView(conversation=env.key, owner=rec.owner)
            self.by_id[env.key] = view
        else:
            view = self.by_id.get(env.key)
            if view is None:
                return None
        if env.seq is None or env.seq <= view.last_seq:
            return None
        view.last_seq = env.seq
        view.events.append(env)
        if isinstance(rec, ConversationErased):
            view.erased = True
            view.events.clear()
        return view

    def owned(self, conversation: str, owner: str) -> ConversationView | None:
        """The conversation if ``owner`` owns it and it is not erased (else None → 404)."""
        view = self.by_id.get(conversation)
        if view is None or view.erased or view.owner != owner:
            return None
        return view

    def list_for(self, owner: str) -> list[ConversationView]:
        return [v for v in self.by_id.values() if v.owner == owner and not v.erased]
