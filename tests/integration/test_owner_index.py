"""A participant's list on an edge that holds only the conversations in use (decision 0015):
the worker indexes each conversation by owner as it starts; an edge with a history window lists
the caller's older conversations from that index (``last_seq`` null until one is opened),
without the erased ones or anyone else's, and after they are evicted; ``voice owners backfill``
indexes conversations started before the index. The real broker, worker and edges."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from deploy.processes import voice_env
from schemas.conversation import ConversationIndexed, ConversationStarted
from streams.envelope import Envelope
from streams.ids import new_conversation_id, owner_key
from streams.sealing import sealer_for
from streams.settings import VoiceSettings
from streams.topics import CONVERSATIONS, OWNERS
from tests.integration.test_conversations_edge import auth, create, get, send
from tests.integration.test_edge_history import held, replied
from tests.support import edge_state, forge_records, log_of, wait_for

pytestmark = pytest.mark.integration

WINDOW_S = 3.0


def listed(url: str, settings: VoiceSettings, sub: str = "alice") -> list[dict[str, object]]:
    r = get(url, settings, "", sub=sub)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_windowed_edge_lists_the_callers_older_conversations_from_the_index(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    full = start_edge()
    mine = [create(full, settings) for _ in range(3)]
    bobs = create(full, settings, sub="bob")
    r = send(full, settings, mine[1], "The bins on our street have not been emptied.")
    assert r.status_code == 202, r.text
    replied(full, settings, r.json()["turn"])
    assert httpx.delete(f"{full}/me/conversations/{mine[2]}", headers=auth(settings),
                        timeout=10).status_code == 204
    # Each conversation's entry is on the index, under its owner, once the worker read it.
    wait_for(lambda: len(log_of(settings, OWNERS, owner_key("default", "alice"))) == 3,
             timeout=30, what="alice's three entries on the index")
    time.sleep(WINDOW_S + 1.0)  # everything so far is older than the window

    windowed = start_edge(VOICE_EDGE_HISTORY_S=str(WINDOW_S))
    assert held(windowed, settings)["in_memory"] == 0
    # Not erased, in the order started, none read yet: no last seq.
    assert listed(windowed, settings) == [{"conversation": c, "last_seq": None}
                                          for c in mine[:2]]
    assert listed(windowed, settings, sub="bob") == [{"conversation": bobs, "last_seq": None}]
    assert listed(windowed, settings, sub="carol") == []
    assert held(windowed, settings)["in_memory"] == 0  # a list reads no conversation
    assert edge_state(windowed, settings)["owners"] == {"in_memory": 2, "held": 0}  # not carol

    # Opened, a conversation is listed with its last seq, as the edge that read it all says.
    assert get(windowed, settings, f"/{mine[1]}").status_code == 200
    assert listed(windowed, settings) == [
        {"conversation": mine[0], "last_seq": None},
        next(c for c in listed(full, settings) if c["conversation"] == mine[1])]

    # Carol had none when asked; her first conversation, started on another edge, is listed.
    fresh = create(full, settings, sub="carol")
    wait_for(lambda: [c["conversation"] for c in listed(windowed, settings, sub="carol")]
             == [fresh], timeout=30, what="carol's new conversation on the windowed edge")
    # Erased through any edge: gone from the list here.
    assert httpx.delete(f"{full}/me/conversations/{mine[0]}", headers=auth(settings),
                        timeout=10).status_code == 204
    wait_for(lambda: [c["conversation"] for c in listed(windowed, settings)] == [mine[1]],
             timeout=30, what="the erased conversation left out")

    # Unused for the window, everything is let go of; the list reads the index again.
    wait_for(lambda: held(windowed, settings)["in_memory"] == 0
             and edge_state(windowed, settings)["owners"]["in_memory"] == 0, timeout=30,
             what="the unused conversations and owners evicted")
    assert listed(windowed, settings) == [{"conversation": mine[1], "last_seq": None}]


def test_the_backfill_indexes_conversations_started_before_the_index(
    settings: VoiceSettings, start_edge  # noqa: ANN001
) -> None:
    # Two conversations on the log as a release before the index wrote them: no worker
    # reads them, so only the backfill can index them.
    sealer = sealer_for(settings)
    old = [new_conversation_id(now=time.time() - 60 + i) for i in range(2)]
    try:
        for cnv in old:
            sealer.create(cnv, "default")
    finally:
        sealer.close()
    forge_records(settings, CONVERSATIONS, [
        Envelope(record=ConversationStarted(conversation=cnv, owner="alice"), key=cnv,
                 source="/voice/sequencer", subject=cnv, seq=1, tenant="default")
        for cnv in old])
    windowed = start_edge(VOICE_EDGE_HISTORY_S="1")
    assert listed(windowed, settings) == []

    for _ in range(2):  # again: changes nothing
        done = subprocess.run([sys.executable, "-m", "deploy.cli", "owners", "backfill"],
                              env=voice_env(settings), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert "2 conversation(s) indexed from 2 record(s)" in done.stdout
    entries = log_of(settings, OWNERS, owner_key("default", "alice"))
    assert sorted(e.record.conversation for e in entries
                  if isinstance(e.record, ConversationIndexed)) == sorted(old * 2)
    # The edge asked before and found none; the entries came by its tail: it reads them again.
    wait_for(lambda: [c["conversation"] for c in listed(windowed, settings)] == old,
             timeout=30, what="the backfilled conversations listed")
