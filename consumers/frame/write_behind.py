"""Table writes held back until a commit needs them, and only the last value of each key sent.

A turn writes four table values: its conversation's state twice (at the message, at the
results) and its workflow's twice (started, ended), each a changelog record that Faust sends
at once. Measured, those four records cost a quarter of the turns a second
(docs/benchmarks.md, "Issue 14, eighteenth pass", section 3).

So a write to a table made ``held_back`` (``consumers.frame.bounded.BoundedTable``; the
workflow runtime's) is *held* here: the table's own value changes at once (every reader in
this worker sees it), and its changelog record waits, remembering the record being handled when
it was written (its *cause*). A held key written again replaces its value and keeps its
earliest cause. A held record is handed to Faust's producer:

- **before an offset commit covers its cause** (``send_covered``, called by the consumer's
  commit before Faust flushes the producer and commits). So no offset is ever committed
  before the table writes of the records it covers are in the changelog. A write whose cause
  is not committed yet may wait: a running step's lease record is held unacknowledged
  (``consumers.workflows.runtime``), so its workflow's "running" is replaced by its end before
  a commit needs either;
- **before a handover or a stop** (``send``: all of it), when the table becomes the lease;
- **once held ``VOICE_WORKER_CHANGELOG_LINGER_S``** (a timer of the worker), so a standby or a
  partition's next owner is never longer than that behind, however long a step runs.

This is Kafka Streams' record cache for Faust's tables. What a crash may lose is what it always
could: the table writes of records whose offsets were not committed, read and handled again by
the partition's next owner. Only the window is longer. The aggregates' tables are not held: a
command handled again after a crash must find its own write and be answered from it, rather
than make its records a second time (decision 0014).

``VOICE_WORKER_CHANGELOG_LINGER_S=0`` sends every write at once, as Faust does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Cause = tuple[Any, int]
"""(topic-partition, offset) of the record whose handling wrote a value."""


@dataclass
class _Held:
    table: Any
    value: bytes | None
    since: float
    causes: dict[Any, int] = field(default_factory=dict)
    """topic-partition → the earliest offset that wrote this key since it was last sent; none:
    written outside a record (sent at the next commit)."""


class WriteBehind:
    """The changelog records held back, the last one of each (table, partition, key)."""

    def __init__(self, linger_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """``linger_s``: how long at most a write is held (0: none is, ``holds`` is false)."""
        self.linger_s = linger_s
        self._clock = clock
        self._held: dict[tuple[str, int, bytes], _Held] = {}
        self.sent = 0
        """Records handed to the producer so far."""
        self.replaced = 0
        """Records never sent: a later write of their key replaced them while held."""

    @property
    def holds(self) -> bool:
        """Whether writes are held at all."""
        return self.linger_s > 0

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, table: Any, partition: int, key: bytes, value: bytes | None,
             cause: Cause | None) -> None:
        """Hold ``table``'s changelog record ``key → value`` (``None``: a tombstone) for
        ``partition``, written while handling ``cause``; it replaces one of the same key still
        held, whose causes it keeps."""
        where = (table.name, partition, key)
        held = self._held.get(where)
        if held is None:
            held = self._held[where] = _Held(table, value, self._clock())
        else:
            self.replaced += 1
            held.value = value
        if cause is not None:
            tp, offset = cause
            held.causes[tp] = min(offset, held.causes.get(tp, offset))

    def send_covered(self, offsets: Mapping[Any, int]) -> int:
        """Before committing ``offsets`` (topic-partition → the next offset to read): hand over
        every held record a record below one of them wrote, and every one written outside a
        record; the number handed."""
        return self._send(lambda h: not h.causes or any(
            tp in offsets and offset < offsets[tp] for tp, offset in h.causes.items()))

    def send_lingering(self) -> int:
        """Hand over every record held ``linger_s`` or longer; the number handed."""
        due = self._clock() - self.linger_s
        return self._send(lambda h: h.since <= due)

    def send(self) -> int:
        """Hand over everything held; the number handed."""
        return self._send(lambda _h: True)

    def _send(self, due: Callable[[_Held], bool]) -> int:
        """Synchronous (Faust's producer buffers what it is given): nothing is held between
        taking a record and sending it."""
        going = [(where, h) for where, h in self._held.items() if due(h)]
        for where, held in going:
            del self._held[where]
            _name, partition, key = where
            held.table.send_changelog(partition, key, held.value, key_serializer="raw",
                                      value_serializer="raw")
        self.sent += len(going)
        return len(going)


def send_before_commit(consumer: Any, write_behind: WriteBehind) -> Any:
    """``consumer`` (Faust's), its ``_commit_offsets`` first handing over the held records its
    offsets cover — before Faust flushes the producer and commits, so the flush waits for them.
    Every commit of Faust's goes through it (the timer's, ``broker_commit_every``'s, a
    handover's, a stop's)."""
    commit_offsets = consumer._commit_offsets

    async def commit_covered_writes_first(offsets: Mapping[Any, int],
                                          *args: Any, **kwargs: Any) -> bool:
        write_behind.send_covered(offsets)
        return bool(await commit_offsets(offsets, *args, **kwargs))

    consumer._commit_offsets = commit_covered_writes_first
    return consumer
