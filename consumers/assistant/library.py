"""The tenant's pattern library: what assistant turns learned, offered to the tenant's other
conversations (seed 000 §11, the closed loop: a finished conversation refines what the next
request reads).

Each worker follows the whole ``voice.assistant`` log (``consumers.frame.follow``, pattern and
turn-request records only) and keeps, per tenant, the most recent ``extracted`` patterns — the
operational lesson the compaction agent wrote, not the ``provisional`` one, which quotes the
asker's own message and so stays in its conversation. A pattern of a turn asked with
``data_isolation`` is never shared. ``shared(tenant, conversation)`` gives a turn the tenant's
patterns from its other conversations; the turn ranks them with its own (``patterns.rank``).

Content: pattern texts are opened (the conversation's key) when their records are read, and
kept in memory only. A conversation whose key has been erased loses its patterns here the next
time one of them is chosen (``still_open``), so an erased conversation teaches nothing after.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

from consumers.assistant.patterns import Pattern
from schemas.assistant import AssistantPatternRecorded, AssistantTurnRequested
from schemas.base import Sealed
from streams.envelope import Envelope
from streams.sealing import Sealer, SealingError

TYPES = frozenset({AssistantPatternRecorded.ce_type, AssistantTurnRequested.ce_type})
"""The records of ``voice.assistant`` the library reads (the follower skips the others)."""
ISOLATED_KEPT = 10_000
"""Isolated turns remembered (their patterns come a few records after the request)."""


@dataclass(frozen=True)
class _Kept:
    pattern: Pattern
    sealed: Sealed


class PatternLibrary:
    """Per tenant, the most recent ``kept`` extracted patterns. Thread-safe: the follower
    applies records on its thread, turns read on theirs."""

    def __init__(self, sealer: Sealer, kept: int) -> None:
        self.sealer = sealer
        self.kept = kept
        self._by_tenant: dict[str | None, OrderedDict[str, _Kept]] = {}
        self._isolated: deque[str] = deque(maxlen=ISOLATED_KEPT)
        self._lock = threading.Lock()

    def apply(self, env: Envelope) -> None:
        """Fold one record of the assistant log (others are ignored)."""
        rec = env.record
        if isinstance(rec, AssistantTurnRequested):
            if rec.options.data_isolation:
                with self._lock:
                    self._isolated.append(rec.turn)
            return
        if not isinstance(rec, AssistantPatternRecorded) or rec.stage != "extracted":
            return
        with self._lock:
            if rec.turn in self._isolated:
                return
        try:
            doc = self.sealer.open_json(rec.conversation, rec.pattern_id, rec.text)
        except SealingError:
            return  # erased (or not ours to open): nothing to learn from it
        pattern = Pattern(rec.pattern_id, rec.turn, rec.stage, str(doc.get("text", "")),
                          tuple(str(k) for k in doc.get("keywords") or ()), env.seq or 0,
                          conversation=rec.conversation)
        with self._lock:
            kept = self._by_tenant.setdefault(env.tenant, OrderedDict())
            kept.pop(rec.pattern_id, None)
            kept[rec.pattern_id] = _Kept(pattern, rec.text)
            while len(kept) > self.kept:
                kept.popitem(last=False)

    def shared(self, tenant: str | None, conversation: str) -> list[Pattern]:
        """The tenant's patterns learned in conversations other than ``conversation``."""
        with self._lock:
            kept = list(self._by_tenant.get(tenant, {}).values())
        return [k.pattern for k in kept if k.pattern.conversation != conversation]

    def still_open(self, tenant: str | None, pattern: Pattern) -> bool:
        """Whether ``pattern``'s conversation can still be opened; if not (erased), every
        pattern of that conversation is forgotten."""
        with self._lock:
            kept = self._by_tenant.get(tenant, {}).get(pattern.pattern_id)
        if kept is None:
            return False
        try:
            self.sealer.open_json(pattern.conversation, pattern.pattern_id, kept.sealed)
            return True
        except SealingError:
            with self._lock:
                mine = self._by_tenant.get(tenant, OrderedDict())
                for pid in [pid for pid, k in mine.items()
                            if k.pattern.conversation == pattern.conversation]:
                    del mine[pid]
            return False
