"""Figures of the single writer (``consumers.frame.writer``) on one conversation, in-process.

A turn costs the writer two commands: the participant's ``SendMessage`` and the turn's
``RecordTurnResults``. Both go through the real ``Writer`` and ``ConversationSequencer``; the
broker is a publisher that acknowledges each record at once with a delivery report (a
partition and the next offset), and the table encodes every value it is given with Faust's
JSON codec, once, as the worker's ``BoundedTable`` does (the changelog record it measures and
sends). So the figure is the writer's CPU alone, without Kafka's.

- ``writer.new_conversation`` (baseline): CPU ms per turn over turns 1–20 of a conversation.
- ``writer.long_conversation``: the same over turns 581–600, when the conversation's state
  holds a full index of its transcript's positions and the answers of its last commands.
  The ratio says what a conversation's length costs each of its commands; before the eleventh
  pass of issue 14 it was ~35 (22.7 ms a turn at 600 against 0.65 at 1–20).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from bench.harness import Context, Result, benchmark
from consumers.conversations.sequencer import ConversationSequencer
from consumers.frame.bounded import changelog_record
from consumers.frame.writer import Writer
from schemas.base import Sealed
from schemas.conversation import (
    RecordTurnResults,
    ReplyRecorded,
    SendMessage,
    StartConversation,
    TurnStateChanged,
)
from streams.envelope import Envelope
from streams.ids import turn_id
from streams.topics import TopicSpec

CONVERSATION = "cnv-00112233aabbccdd"
SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy" * 40)
"""A sealed text of ~300 bytes: a short message's ciphertext."""
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = 20
"""Turns measured in one window."""
LONG = 600
"""The turn the long window ends at."""
RUNS = 3
"""Conversations measured (each from its first turn); the median window is reported."""


class _Delivered:
    """A delivery report: where the broker put the record."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class _Broker:
    """What the writer needs of a publisher: each record acknowledged at once."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}

    @property
    def producer(self) -> _Broker:
        return self

    def produce(self, spec: TopicSpec, env: Envelope) -> Any:  # noqa: ARG002
        offset = self.offsets.get(spec.name, 0)
        self.offsets[spec.name] = offset + 1
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(_Delivered(offset))
        return fut


class _EncodingTable(dict[str, Any]):
    """A table that encodes each value as the worker's does (``BoundedTable``: once, the
    record it measures and sends)."""

    def __setitem__(self, key: str, value: Any) -> None:
        changelog_record(self, key, value)
        super().__setitem__(key, value)

    key_serializer = value_serializer = "json"


def _commands(n: int, seq: int) -> tuple[Envelope, Envelope]:
    """Turn ``n``'s two commands, its message at ``seq``."""
    turn = turn_id(CONVERSATION, seq)
    send = Envelope(record=SendMessage(conversation=CONVERSATION, message_id=f"m{n}",
                                       text=SEALED), key=CONVERSATION, source="/bench",
                    id=f"c{n}", time=T0, tenant="bench")
    results = Envelope(record=RecordTurnResults(
        conversation=CONVERSATION, turn=turn,
        reply=ReplyRecorded(conversation=CONVERSATION, turn=turn, reply_id=f"{turn}:reply",
                            text=SEALED),
        ended=TurnStateChanged(conversation=CONVERSATION, turn=turn, state="Replied")),
        key=CONVERSATION, source="/bench", id=f"{turn}:results", time=T0, tenant="bench")
    return send, results


async def _conversation(first: int, last: int) -> tuple[float, int]:
    """One conversation taken to turn ``last``: CPU ms per turn over turns ``first``..``last``
    (counted from 1), and the bytes of its table value (its changelog record) at the end."""
    table = _EncodingTable()
    writer = Writer(_Broker(), "bench.voice.commands")  # type: ignore[arg-type]
    writer.register(ConversationSequencer(), table)
    await writer.dispatch(Envelope(record=StartConversation(conversation=CONVERSATION,
                                                            owner="bench"),
                                   key=CONVERSATION, source="/bench", id="c0", time=T0,
                                   tenant="bench"))
    t0 = 0.0
    for n in range(1, last + 1):
        if n == first:
            t0 = time.process_time()
        for cmd in _commands(n, table[CONVERSATION]["seq"] + 1):
            await writer.dispatch(cmd)
    ms = 1000 * (time.process_time() - t0) / (last - first + 1)
    return ms, len(changelog_record(table, CONVERSATION, table[CONVERSATION])[1])


def _windows(first: int, last: int) -> Result:
    runs = [asyncio.run(_conversation(first, last)) for _ in range(RUNS)]
    per_turn = [ms for ms, _ in runs]
    return {"ms_per_turn": round(statistics.median(per_turn), 3),
            "runs_ms_per_turn": [round(r, 3) for r in per_turn],
            "turns": f"{first}-{last}", "commands_per_turn": 2,
            "state_bytes_after": runs[-1][1]}


@benchmark("writer.new_conversation")
def new_conversation(ctx: Context) -> Result:  # noqa: ARG001
    """The writer's CPU per turn (two commands) over turns 1-20 of a conversation."""
    return _windows(1, WINDOW)


@benchmark("writer.long_conversation", baseline="writer.new_conversation",
           compare=("ms_per_turn",))
def long_conversation(ctx: Context) -> Result:  # noqa: ARG001
    """The writer's CPU per turn over turns 581-600 of one conversation."""
    return _windows(LONG - WINDOW + 1, LONG)
