"""An edge started with a history window (``VOICE_EDGE_HISTORY_S``, decision 0011) on a log
whose assistant chats started before it: it is ready without reading them, and answers an old
chat — its display stream from 0, its turns, a next message — exactly as an edge that read the
whole log does, including records appended after it started; unknown and other people's chats
stay 404; unused ones are evicted and read again. The real broker, worker and two edges."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import httpx
import pytest

from streams.settings import VoiceSettings
from tests.integration.test_assistant_chat import BASE, auth, chat, resume, turn_done
from tests.support import edge_state, wait_for

pytestmark = pytest.mark.integration

WINDOW_S = 3.0
CHATS = 2


def held(url: str, settings: VoiceSettings) -> dict[str, int]:
    """What the edge holds of the assistant's log, as ``/ops/edge`` tells an operator."""
    return edge_state(url, settings)["assistant"]


def replied(url: str, settings: VoiceSettings, conversation: str, turn: str) -> dict:
    return wait_for(lambda: turn_done(url, settings, conversation, turn), timeout=60,
                    what=f"turn {turn} replied")


def display(url: str, settings: VoiceSettings, conversation: str) -> list[tuple]:
    """(id, data) of every display event of ``conversation`` from 0 (the stream ends idle)."""
    s = resume(url, settings, conversation, after=0)
    assert s.status == 200
    return [(f.id, f.data) for f in s.events]


def test_an_edge_with_a_window_serves_assistant_chats_started_before_it(
        settings: VoiceSettings, start_worker: Callable[..., object],
        start_edge: Callable[..., str]) -> None:
    start_worker()
    full = start_edge()  # reads the whole log
    chats: list[str] = []
    for i in range(CHATS):
        r = chat(full, settings, {"message": f"Hello, this is chat number {i}, what can you do?"})
        assert r.status_code == 202, r.text
        conversation, turn = r.json()["conversation_id"], r.json()["turn"]
        assert uuid.UUID(conversation).version == 7  # its id says when it began
        replied(full, settings, conversation, turn)
        chats.append(conversation)
    time.sleep(WINDOW_S + 1.0)  # every record so far is older than the window
    windowed = start_edge(VOICE_EDGE_HISTORY_S=str(WINDOW_S))
    assert held(windowed, settings) == {"in_memory": 0, "held": 0}  # none read at start

    # A next turn of an old chat through the full edge: the windowed one keeps nothing of it.
    r = chat(full, settings, {"message": "And one more question please",
                              "conversation_id": chats[1]})
    assert r.status_code == 202, r.text
    replied(full, settings, chats[1], r.json()["turn"])
    assert held(windowed, settings)["in_memory"] == 0

    for conversation in chats:
        want = display(full, settings, conversation)
        assert want and want[0][0] == "1"
        assert display(windowed, settings, conversation) == want
    first_turn = f"{chats[0]}:turn-2"
    assert turn_done(windowed, settings, chats[0], first_turn) == \
        turn_done(full, settings, chats[0], first_turn)
    assert held(windowed, settings) == {"in_memory": CHATS, "held": 0}

    # Written through the windowed edge: an old chat takes its next message there too.
    before = len(display(full, settings, chats[0]))
    r = chat(windowed, settings, {"message": "Thanks, and what about rivers?",
                                  "conversation_id": chats[0]})
    assert r.status_code == 202, r.text
    assert r.json()["after"] == before
    replied(windowed, settings, chats[0], r.json()["turn"])
    assert display(windowed, settings, chats[0]) == display(full, settings, chats[0])

    # Still 404: an id no one made (a timed one, and a random one), and someone else's chat.
    for unknown in (str(uuid.uuid4()), "01a246db-60e2-7561-a8fb-aa2c38e11df7"):
        r = httpx.get(f"{windowed}{BASE}/conversations/{unknown}/stream", timeout=30,
                      headers=auth(settings))
        assert r.status_code == 404, r.text
    assert resume(windowed, settings, chats[1], after=0, sub="bob").status == 404

    # Unused for the window, every chat is evicted; asked for again, each is read again.
    wait_for(lambda: held(windowed, settings)["in_memory"] == 0, timeout=30,
             what="the unused chats evicted")
    for conversation in chats:
        assert display(windowed, settings, conversation) == display(full, settings, conversation)


def test_a_cursor_older_than_the_edge_keeps_is_served_from_the_log(
        settings: VoiceSettings, start_worker: Callable[..., object],
        start_edge: Callable[..., str]) -> None:
    start_worker()
    keeps_all = start_edge()
    keeps_ten = start_edge(VOICE_EDGE_EVENTS_KEPT="10")  # fewer than a chat of three turns has
    r = chat(keeps_all, settings, {"message": "Hello, what can you do for me today?"})
    assert r.status_code == 202, r.text
    conversation = r.json()["conversation_id"]
    replied(keeps_all, settings, conversation, r.json()["turn"])
    for text in ("And what about rivers?", "And lakes, please?"):
        r = chat(keeps_all, settings, {"message": text, "conversation_id": conversation})
        assert r.status_code == 202, r.text
        replied(keeps_all, settings, conversation, r.json()["turn"])
    want = display(keeps_all, settings, conversation)
    assert len(want) > 10 and [int(i) for i, _ in want] == list(range(1, len(want) + 1))
    # From 0, and from inside what the edge no longer keeps: every event once, in order.
    wait_for(lambda: display(keeps_ten, settings, conversation) == want, timeout=30,
             what="the whole stream from the edge that keeps ten events")
    later = resume(keeps_ten, settings, conversation, after=3)
    assert later.status == 200 and [(f.id, f.data) for f in later.events] == want[3:]
    by_header = resume(keeps_ten, settings, conversation, **{"Last-Event-ID": "1"})
    assert [(f.id, f.data) for f in by_header.events] == want[1:]
