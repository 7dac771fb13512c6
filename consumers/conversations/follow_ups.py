"""What a conversation's records start elsewhere, produced by their writer (decision 0016).

Once the broker has a command's records (the writer knows where each landed), the sequencer
names what they start: each opened turn's workflow (``WorkflowStarted`` on ``voice.workflows``,
its input the ``TurnOpened``'s position) and each started conversation's entry in the index by
owner (``ConversationIndexed`` on ``voice.owners``, decision 0015). The writer produces them
before it writes the conversation's state, so a crash in between decides the command again and
produces the same records again, under the same ids: the workflow runtime starts a workflow
once, and the index is a set.

A conversation begun before its writer kept positions opens turns without ``history``; the
product's hook on the log starts those, told each record by the same writer
(``Turns.on_conversation_record``, ``ctx.on_recorded``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from consumers.conversations.owners import index_record
from consumers.conversations.transcript import opened_at
from schemas.conversation import TurnOpened
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope
from streams.topics import OWNERS, WORKFLOWS, TopicSpec

KIND = "conversation-turn"
SOURCE = "/voice/turn-worker"


def turn_start(env: Envelope, conversation: str, turn: str, message_seq: int,
               history: dict[str, Any]) -> Envelope:
    """The ``WorkflowStarted`` of ``turn``, opened by ``env``: its id ``{turn}:1``, its input a
    reference to its history — the record that names its positions (``opened_at``) or, in a
    conversation begun before its writer kept them, the positions."""
    started = WorkflowStarted(workflow=turn, kind=KIND, input={
        "conversation": conversation, "turn": turn, "message_seq": message_seq,
        "tenant": env.tenant, "history": history})
    return Envelope(record=started, key=turn, source=SOURCE, subject=turn, seq=1,
                    tenant=env.tenant, correlation=env.correlation, causation=env.id,
                    id=f"{turn}:1")


def follow_ups(records: Sequence[tuple[Envelope, int, int]]) -> list[tuple[TopicSpec, Envelope]]:
    """What placed conversation records — (envelope, partition, offset) each — start."""
    out: list[tuple[TopicSpec, Envelope]] = []
    for env, partition, offset in records:
        rec = env.record
        if isinstance(rec, TurnOpened):
            if rec.history is not None and env.seq is not None:
                out.append((WORKFLOWS, turn_start(env, rec.conversation, rec.turn, env.seq,
                                                  opened_at(partition, env.seq, offset))))
            continue
        indexed = index_record(env)
        if indexed is not None:
            out.append((OWNERS, indexed))
    return out
