"""The history ``edge.start_with_history`` writes is a real conversation log: every record
decodes, seqs are dense from 1, and the edge's own views apply it to Replied turns."""

from __future__ import annotations

import random

from api.conversations.views import ConversationViews
from bench.scale import RECORDS_PER_CONVERSATION, TURNS_PER_CONVERSATION, conversation_records
from streams.envelope import Envelope, decode, encode


def _log(conversation: str) -> list[Envelope]:
    records = conversation_records(conversation, random.Random(1))
    out = []
    for seq, rec in enumerate(records, start=1):
        key, value, headers = encode(Envelope(record=rec, key=conversation,
                                              source="/voice/sequencer", seq=seq,
                                              tenant="default"))
        out.append(decode(key, value, headers))
    return out


def test_history_is_a_log_the_edge_applies() -> None:
    conversation = "cnv-0123456789abcdef"
    log = _log(conversation)
    assert len(log) == RECORDS_PER_CONVERSATION
    assert [e.seq for e in log] == list(range(1, RECORDS_PER_CONVERSATION + 1))
    views = ConversationViews()
    for env in log:
        assert views.apply(env) is not None  # none refused as a duplicate or unknown
    view = views[conversation]
    assert view.owner == "bench-history" and view.tenant == "default"
    assert view.last_seq == RECORDS_PER_CONVERSATION
    assert [t.state for t in view.turns.values()] == ["Replied"] * TURNS_PER_CONVERSATION
    assert all(t.reply is not None for t in view.turns.values())
    # Each turn is the one its message requested (turn id = conversation:turn-<message seq>).
    assert sorted(view.turns) == [f"{conversation}:turn-{2 + 5 * t}"
                                  for t in range(TURNS_PER_CONVERSATION)]
