"""The janitor: every turn past its deadline is ended, by the worker owning its aggregate.

A turn reaches a terminal state along many paths (its step's reply, its workflow's ``on_end``,
a cancel); each can be cut by a worker dying, a record dead-lettered, a model that never
answers. The janitor is the backstop of all of them: each pass, it asks every aggregate with
deadlines (``overdue``) which of its turns are past theirs — only for the aggregates whose
partition of ``voice.commands`` this worker owns, so it runs where their single writer runs and
never races another host — and submits what ``overdue`` names (``ExpireTurn``, …) as commands.
The aggregate's ``decide`` ends the turn if it is still open, and ignores the command if it
ended meanwhile: a turn is ended once, whoever asks and however often.

It never writes a table and never decides anything itself: it only submits commands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from consumers.frame.aggregate import Aggregate
from consumers.workflows.runtime import partition_of
from schemas.base import Record
from streams.envelope import Envelope

log = logging.getLogger(__name__)

SOURCE = "/voice/janitor"

RESEND_AFTER_S = 30.0
"""A command the janitor sent is not sent again sooner (its writer may not have applied it)."""


class WithDeadlines(Protocol):
    """An aggregate whose turns have deadlines."""

    def overdue(self, key: str, stored: dict[str, Any], now: datetime) -> list[Record]:
        """The commands that end the turns past their deadline at ``now``, read from the
        aggregate's stored value (its table's dict, not loaded: this runs for every aggregate
        of the worker's partitions, each pass)."""


@dataclass(frozen=True)
class Watched:
    aggregate: Aggregate[Any]
    table: MutableMapping[Any, Any]


class Janitor:
    """Finds the overdue turns of this worker's partitions and names the commands ending them."""

    def __init__(self, partitions: int) -> None:
        """``partitions`` is the partition count of ``voice.commands`` (and its tables)."""
        self.partitions = partitions
        self.watched: list[Watched] = []
        self._sent: dict[str, float] = {}
        """command id → when it was last sent (monotonic)."""

    def watch(self, aggregate: Aggregate[Any], table: MutableMapping[Any, Any]) -> None:
        """Look after ``aggregate``'s turns if it has deadlines (an ``overdue`` method)."""
        if callable(getattr(aggregate, "overdue", None)):
            self.watched.append(Watched(aggregate, table))

    def due(self, active: set[int], now: datetime) -> list[Envelope]:
        """The commands to submit now, for the aggregates of the ``active`` partitions."""
        clock = time.monotonic()
        out = []
        for w in self.watched:
            overdue = w.aggregate.overdue  # type: ignore[attr-defined]
            for key, raw in list(w.table.items()):
                if not raw or partition_of(key, self.partitions) not in active:
                    continue  # a standby copy: another worker owns it
                for rec in overdue(key, raw, now):
                    turn = getattr(rec, "turn", key)
                    command_id = f"{turn}:deadline"
                    last = self._sent.get(command_id)
                    if last is not None and clock - last < RESEND_AFTER_S:
                        continue
                    self._sent[command_id] = clock
                    out.append(Envelope(record=rec, key=key, source=SOURCE, subject=key,
                                        tenant=raw.get("tenant"), correlation=turn,
                                        id=command_id, time=now))
        for command_id, sent in list(self._sent.items()):
            if clock - sent > 10 * RESEND_AFTER_S:
                del self._sent[command_id]  # long applied: keep the memory small
        return out
