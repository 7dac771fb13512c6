"""Each assistant conversation's transcript index and patterns, folded from its log.

The worker keeps one ``Transcript`` per conversation in a Faust table, fed by ``voice.assistant``
(deduped by seq). It holds *positions* of the conversation's records on the log — the latest
history summary, the requests and replies after it, patterns — never their content, so the
value stays small however long the conversation grows. Applying a record may start workflows,
each with a reference as its input (``consumers.frame.logrefs``): a requested turn starts
``assistant-turn`` with the positions of its request, of the summary and the transcript after
it, and of the patterns; a turn that ended ``Replied`` starts ``assistant-extraction`` with the
positions of the exchange. Entries past the sealed-byte bound without a summary are left out
of the index, and ``omitted_through`` says so, so the turn tells the model (never silently).
The step reads those records back (``read``) and opens them with the ``open_*`` helpers,
inside the step that hands them to a model.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers.assistant.agent import history_with_seqs
from consumers.assistant.patterns import Pattern
from consumers.engine.history import lead_with_stored
from consumers.frame.logrefs import LogReader, Position, recent
from schemas.assistant import (
    AssistantConversationStarted,
    AssistantHistorySummarised,
    AssistantPatternRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
)
from streams.envelope import Envelope
from streams.sealing import Sealer
from streams.topics import ASSISTANT

TURN_KIND = "assistant-turn"
EXTRACT_KIND = "assistant-extraction"
READ_SETTING = "VOICE_ASSISTANT_HISTORY_BYTES"

Start = tuple[str, str, dict[str, Any]]
"""(workflow kind, workflow id, input)"""


def _at(entry: dict[str, Any]) -> list[int]:
    return Position(entry["seq"], entry["offset"]).to_json()


@dataclass
class Transcript:
    """What the worker keeps per conversation (a Faust table value, as a dict)."""

    seq: int = 0
    owner: str | None = None
    partition: int | None = None
    """The partition of ``voice.assistant`` holding the conversation's records."""
    entries: list[dict[str, Any]] = field(default_factory=list)
    """``{"seq", "offset", "bytes", "role": "user" | "assistant", "turn"}``"""
    patterns: list[dict[str, Any]] = field(default_factory=list)
    """``{"seq", "offset", "pattern_id"}``"""
    summary: dict[str, int] | None = None
    """``{"seq", "offset", "through"}`` of the latest ``AssistantHistorySummarised``;
    ``entries`` are only those after ``through``."""
    omitted_through: int = 0
    """The last seq left out of ``entries`` unsummarised (over the byte bound); 0 if none."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Transcript:
        return cls() if d is None else cls(**copy.deepcopy(d))

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy({"seq": self.seq, "owner": self.owner, "partition": self.partition,
                              "entries": self.entries, "patterns": self.patterns,
                              "summary": self.summary, "omitted_through": self.omitted_through})

    @property
    def covered(self) -> int:
        """The last seq the summary covers (0 without one)."""
        return self.summary["through"] if self.summary else 0

    def _bound(self, history_bytes: int) -> None:
        """Keep the entries a turn reads (at most ``history_bytes`` sealed, at least the last
        exchange), starting with a request; what is left out is recorded as omitted."""
        kept = recent(self.entries, history_bytes, keep=2)
        while kept and kept[0]["role"] != "user":
            kept = kept[1:]  # a reply without its request would dangle
        if len(kept) < len(self.entries):
            dropped = self.entries[len(self.entries) - len(kept) - 1]
            self.omitted_through = max(self.omitted_through, dropped["seq"])
        self.entries = kept

    def _entry(self, role: str, turn: str) -> dict[str, Any] | None:
        return next((e for e in reversed(self.entries)
                     if e["role"] == role and e["turn"] == turn), None)

    def apply(self, env: Envelope, partition: int, offset: int, history_bytes: int,
              patterns_kept: int) -> list[Start] | None:
        """Fold the record at ``partition``/``offset`` in; the workflows to start, or None for
        a redelivery."""
        if env.seq is None or env.seq <= self.seq:
            return None
        self.seq, self.partition = env.seq, partition
        rec, conversation = env.record, env.key
        here = {"seq": env.seq, "offset": offset}
        starts: list[Start] = []
        if isinstance(rec, AssistantConversationStarted):
            self.owner = rec.owner
        elif isinstance(rec, AssistantTurnRequested):
            starts.append((TURN_KIND, rec.turn, {
                "conversation": conversation, "turn": rec.turn, "owner": self.owner,
                "tenant": env.tenant, "message_id": rec.message_id,
                "datasets": [r.model_dump() for r in rec.datasets],
                "options": rec.options.model_dump(),
                "log": {"partition": partition, "request": _at(here),
                        "summary": [_at(self.summary)] if self.summary else [],
                        "transcript": [_at(e) for e in self.entries],
                        "omitted_through": self.omitted_through,
                        "patterns": [_at(p) for p in self.patterns]}}))
            self.entries.append({**here, "bytes": len(rec.request.ciphertext), "role": "user",
                                 "turn": rec.turn})
        elif isinstance(rec, AssistantReplyRecorded):
            old = self._entry("assistant", rec.turn)  # a retried attempt's reply replaces it
            if old is not None:
                self.entries.remove(old)
            self.entries.append({**here, "bytes": len(rec.chain.ciphertext),
                                 "role": "assistant", "turn": rec.turn})
        elif isinstance(rec, AssistantTurnEnded):
            user, reply = self._entry("user", rec.turn), self._entry("assistant", rec.turn)
            if rec.state == "Replied" and user is not None and reply is not None:
                workflow = f"{rec.turn}:extract"
                starts.append((EXTRACT_KIND, workflow, {
                    "conversation": conversation, "turn": rec.turn, "owner": self.owner,
                    "tenant": env.tenant,
                    "log": {"partition": partition, "user": _at(user),
                            "assistant": _at(reply)}}))
        elif isinstance(rec, AssistantPatternRecorded):
            self.patterns = [p for p in self.patterns if p["pattern_id"] != rec.pattern_id]
            self.patterns.append({**here, "pattern_id": rec.pattern_id})
            self.patterns = self.patterns[-patterns_kept:]
        elif isinstance(rec, AssistantHistorySummarised) and rec.through_seq > self.covered:
            self.summary = {**here, "through": rec.through_seq}
            self.entries = [e for e in self.entries if e["seq"] > rec.through_seq]
            if self.omitted_through <= rec.through_seq:
                self.omitted_through = 0
        self._bound(history_bytes)
        return starts

    # --- reading and opening (inside a step only) --------------------------------------------

    @staticmethod
    async def read(reader: LogReader, conversation: str, ref: dict[str, Any],
                   *names: str) -> dict[str, list[Envelope]]:
        """The records ``ref`` (a workflow input's ``log``) points at under ``names``, each a
        position or a list of positions: name → records, in one read."""
        groups = {n: [ref[n]] if ref[n] and isinstance(ref[n][0], int) else list(ref[n])
                  for n in names}
        positions = [Position.from_json(p) for n in names for p in groups[n]]
        records = await reader.read(ASSISTANT, int(ref["partition"]), conversation, positions)
        out: dict[str, list[Envelope]] = {}
        for n in names:
            out[n], records = records[:len(groups[n])], records[len(groups[n]):]
        return out

    @staticmethod
    def _open(sealer: Sealer, conversation: str, env: Envelope) -> dict[str, Any]:
        rec = env.record
        if isinstance(rec, AssistantTurnRequested):
            return sealer.open_json(conversation, rec.message_id, rec.request)
        if isinstance(rec, AssistantReplyRecorded):
            return sealer.open_json(conversation, f"{rec.reply_id}/chain", rec.chain)
        raise TypeError(f"record {env.id!r} ({env.type}) is not a request or a reply")

    @staticmethod
    def _role(env: Envelope) -> str:
        return "user" if isinstance(env.record, AssistantTurnRequested) else "assistant"

    @staticmethod
    def open_request(sealer: Sealer, conversation: str, env: Envelope) -> dict[str, Any]:
        """The turn's request (message, attachments, focus, selection)."""
        return Transcript._open(sealer, conversation, env)

    @staticmethod
    def open_history(sealer: Sealer, conversation: str, envs: Sequence[Envelope],
                     summary: Sequence[Envelope] = (), omitted_through: int = 0
                     ) -> tuple[list[dict[str, Any]], list[int]]:
        """The summary (if any) and the requests and replies after it as Messages-API
        history, led by the summary and by a note of what was left out unsummarised (as a
        participant turn's, ``lead_with_stored``); and the last seq each message holds."""
        history, seqs = history_with_seqs([
            (Transcript._role(e), Transcript._open(sealer, conversation, e), e.seq or 0)
            for e in envs])
        stored = None
        for env in summary:
            rec = env.record
            assert isinstance(rec, AssistantHistorySummarised)
            stored = (rec.through_seq, sealer.open_text(conversation, rec.summary_id, rec.text))
        return lead_with_stored(history, seqs, stored, omitted_through, READ_SETTING)

    @staticmethod
    def open_turn(sealer: Sealer, conversation: str, ref: dict[str, Any],
                  records: dict[str, list[Envelope]]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], list[int], list[Pattern]]:
        """What an assistant turn reads, opened from the records its input's ``log`` (``ref``)
        names: (request, history, the last seq of each history message, patterns). The
        worker's step and a re-run (``voice replay assistant --rerun``) both open it here."""
        request = Transcript.open_request(sealer, conversation, records["request"][0])
        history, seqs = Transcript.open_history(
            sealer, conversation, records["transcript"], records.get("summary", ()),
            int(ref.get("omitted_through") or 0))
        return request, history, seqs, Transcript.open_patterns(sealer, conversation,
                                                                records["patterns"])

    @staticmethod
    def turn_records(ref: dict[str, Any]) -> tuple[str, ...]:
        """The names of ``ref`` a turn reads (no summary in inputs of older workers)."""
        return ("request", "transcript", "patterns", *(("summary",) if "summary" in ref else ()))

    @staticmethod
    def open_patterns(sealer: Sealer, conversation: str, envs: Sequence[Envelope]
                      ) -> list[Pattern]:
        out = []
        for env in envs:
            p = env.record
            assert isinstance(p, AssistantPatternRecorded)
            doc = sealer.open_json(conversation, p.pattern_id, p.text)
            out.append(Pattern(p.pattern_id, p.turn, p.stage, str(doc.get("text", "")),
                               tuple(doc.get("keywords") or ()), env.seq or 0))
        return out

    @staticmethod
    def open_exchange(sealer: Sealer, conversation: str, user: Envelope, assistant: Envelope
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(request, reply chain) of an extraction's turn."""
        return (Transcript._open(sealer, conversation, user),
                Transcript._open(sealer, conversation, assistant))
