"""Each assistant conversation's sealed transcript and patterns, folded from its log.

The worker keeps one ``Transcript`` per conversation in a Faust table, fed by ``voice.assistant``
(deduped by seq). Applying a record may start workflows: a requested turn starts
``assistant-turn`` with its sealed request, the sealed transcript before it (the most recent
entries, bounded in bytes) and the sealed patterns, so the step needs no other state; a turn
that ended ``Replied`` starts ``assistant-extraction`` with the sealed exchange. Content stays
sealed here; the ``open_*`` helpers open it inside the step that hands it to a model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from consumers.assistant.agent import history_messages
from consumers.assistant.patterns import Pattern
from schemas.assistant import (
    AssistantConversationStarted,
    AssistantPatternRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
)
from schemas.base import Sealed
from streams.envelope import Envelope
from streams.sealing import Sealer

TURN_KIND = "assistant-turn"
EXTRACT_KIND = "assistant-extraction"

Start = tuple[str, str, dict[str, Any]]
"""(workflow kind, workflow id, input)"""


def _size(entry: dict[str, Any]) -> int:
    return len(entry["sealed"]["ciphertext"])


def recent(entries: list[dict[str, Any]], budget: int, keep: int = 2) -> list[dict[str, Any]]:
    """The most recent entries whose sealed size fits ``budget`` (at least the last ``keep``)."""
    out: list[dict[str, Any]] = []
    total = 0
    for entry in reversed(entries):
        total += _size(entry)
        if total > budget and len(out) >= keep:
            break
        out.append(entry)
    return out[::-1]


@dataclass
class Transcript:
    """What the worker keeps per conversation (a Faust table value, as a dict)."""

    seq: int = 0
    owner: str | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)
    """``{"seq", "role": "user" | "assistant", "turn", "content_id", "sealed"}``"""
    patterns: list[dict[str, Any]] = field(default_factory=list)
    """``{"seq", "turn", "pattern_id", "stage", "sealed"}``"""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Transcript:
        return cls() if d is None else cls(**copy.deepcopy(d))

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy({"seq": self.seq, "owner": self.owner, "entries": self.entries,
                              "patterns": self.patterns})

    def _entry(self, role: str, turn: str) -> dict[str, Any] | None:
        return next((e for e in reversed(self.entries)
                     if e["role"] == role and e["turn"] == turn), None)

    def apply(self, env: Envelope, history_bytes: int, patterns_kept: int
              ) -> list[Start] | None:
        """Fold one log record in; the workflows to start, or None for a redelivery."""
        if env.seq is None or env.seq <= self.seq:
            return None
        self.seq = env.seq
        rec, conversation = env.record, env.key
        starts: list[Start] = []
        if isinstance(rec, AssistantConversationStarted):
            self.owner = rec.owner
        elif isinstance(rec, AssistantTurnRequested):
            starts.append((TURN_KIND, rec.turn, {
                "conversation": conversation, "turn": rec.turn, "owner": self.owner,
                "tenant": env.tenant, "message_id": rec.message_id,
                "request": rec.request.model_dump(),
                "datasets": [r.model_dump() for r in rec.datasets],
                "options": rec.options.model_dump(),
                "transcript": recent(self.entries, history_bytes),
                "patterns": list(self.patterns)}))
            self.entries.append({"seq": env.seq, "role": "user", "turn": rec.turn,
                                 "content_id": rec.message_id, "sealed": rec.request.model_dump()})
        elif isinstance(rec, AssistantReplyRecorded):
            old = self._entry("assistant", rec.turn)  # a retried attempt's reply replaces it
            if old is not None:
                self.entries.remove(old)
            self.entries.append({"seq": env.seq, "role": "assistant", "turn": rec.turn,
                                 "content_id": f"{rec.reply_id}/chain",
                                 "sealed": rec.chain.model_dump()})
        elif isinstance(rec, AssistantTurnEnded):
            user, reply = self._entry("user", rec.turn), self._entry("assistant", rec.turn)
            if rec.state == "Replied" and user is not None and reply is not None:
                workflow = f"{rec.turn}:extract"
                starts.append((EXTRACT_KIND, workflow, {
                    "conversation": conversation, "turn": rec.turn, "owner": self.owner,
                    "tenant": env.tenant, "user": user, "assistant": reply}))
        elif isinstance(rec, AssistantPatternRecorded):
            self.patterns = [p for p in self.patterns if p["pattern_id"] != rec.pattern_id]
            self.patterns.append({"seq": env.seq, "turn": rec.turn, "pattern_id": rec.pattern_id,
                                  "stage": rec.stage, "sealed": rec.text.model_dump()})
            self.patterns = self.patterns[-patterns_kept:]
        # The table keeps twice what a turn carries, so the next turns still have enough.
        self.entries = recent(self.entries, 2 * history_bytes)
        return starts

    # --- opening (inside a step only) --------------------------------------------------------

    @staticmethod
    def _open(sealer: Sealer, conversation: str, entry: dict[str, Any]) -> dict[str, Any]:
        return sealer.open_json(conversation, entry["content_id"],
                                Sealed.model_validate(entry["sealed"]))

    @staticmethod
    def open_request(sealer: Sealer, conversation: str, inp: dict[str, Any]) -> dict[str, Any]:
        """The turn's request (message, attachments, focus, selection)."""
        return sealer.open_json(conversation, inp["message_id"],
                                Sealed.model_validate(inp["request"]))

    @staticmethod
    def open_history(sealer: Sealer, conversation: str, entries: list[dict[str, Any]]
                     ) -> list[dict[str, Any]]:
        """The transcript as Messages-API history."""
        turns = [(e["role"], Transcript._open(sealer, conversation, e)) for e in entries]
        return history_messages(turns)

    @staticmethod
    def open_patterns(sealer: Sealer, conversation: str, patterns: list[dict[str, Any]]
                      ) -> list[Pattern]:
        out = []
        for p in patterns:
            doc = sealer.open_json(conversation, p["pattern_id"],
                                   Sealed.model_validate(p["sealed"]))
            out.append(Pattern(p["pattern_id"], p["turn"], p["stage"], str(doc.get("text", "")),
                               tuple(doc.get("keywords") or ()), p["seq"]))
        return out

    @staticmethod
    def open_exchange(sealer: Sealer, conversation: str, inp: dict[str, Any]
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(request, reply chain) of an extraction's turn."""
        return (Transcript._open(sealer, conversation, inp["user"]),
                Transcript._open(sealer, conversation, inp["assistant"]))
