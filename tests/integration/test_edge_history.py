"""An edge started with a history window (``VOICE_EDGE_HISTORY_S``, decision 0011) on a log
whose conversations started before it: it is ready without reading them, and answers an old
conversation — its stream from seq 0, its transcript — exactly as an edge that read the whole
log does, including records appended after it started; unknown and other people's ids stay
404. The real broker, the real worker (simulator), two real edges."""

from __future__ import annotations

import time

import httpx
import pytest

from streams.settings import VoiceSettings
from tests.integration.test_conversations_edge import (
    auth,
    create,
    get,
    read_stream,
    send,
    turn_state,
)
from tests.support import SseFrame, edge_state, wait_for

pytestmark = pytest.mark.integration

WINDOW_S = 3.0
CONVERSATIONS = 3


def replied(url: str, settings: VoiceSettings, turn: str) -> None:
    wait_for(lambda: turn_state(url, settings, turn, "Replied"), timeout=90,
             what=f"turn {turn} Replied")


def held(url: str, settings: VoiceSettings) -> dict[str, int]:
    """What the edge holds in memory, as ``/ops/edge`` tells an operator."""
    return edge_state(url, settings)["conversations"]


def whole_stream(url: str, settings: VoiceSettings, cnv: str, last_seq: int
                 ) -> list[tuple[str | None, str | None, str | None]]:
    """(id, event, data) of every event of ``cnv`` from seq 0 through ``last_seq``."""
    s = read_stream(url, settings, cnv, after=0,
                    stop=lambda ev: bool(ev) and int(ev[-1].id or 0) >= last_seq)
    assert s.status == 200, s.body
    return [(f.id, f.event, f.text) for f in s.events if isinstance(f, SseFrame)]


def last_seq(url: str, settings: VoiceSettings, cnv: str) -> int:
    """The conversation's last seq, as the edge that read the whole log lists it."""
    r = get(url, settings, "")
    assert r.status_code == 200, r.text
    return next(int(c["last_seq"]) for c in r.json() if c["conversation"] == cnv)


def test_an_edge_with_a_window_serves_conversations_started_before_it(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    full = start_edge()  # reads the whole log
    convs = [create(full, settings) for _ in range(CONVERSATIONS)]
    for i, cnv in enumerate(convs):
        r = send(full, settings, cnv, f"The bins on street {i} have not been emptied.")
        assert r.status_code == 202, r.text
        replied(full, settings, r.json()["turn"])
    # Every record so far is older than the window before the windowed edge starts.
    time.sleep(WINDOW_S + 1.0)
    windowed = start_edge(VOICE_EDGE_HISTORY_S=str(WINDOW_S))
    assert held(windowed, settings) == {"in_memory": 0, "held": 0}  # none of them read at start

    # A message to an old conversation the windowed edge has not been asked about: it keeps
    # nothing of it (the read, when asked, gets these records from the log too).
    r = send(full, settings, convs[1], "And the street lights are out as well.")
    assert r.status_code == 202, r.text
    replied(full, settings, r.json()["turn"])
    assert held(windowed, settings) == {"in_memory": 0, "held": 0}

    for cnv in convs:
        end = last_seq(full, settings, cnv)
        want = whole_stream(full, settings, cnv, end)
        assert want and want[0][0] == "2"  # seq 1 (started) is no event
        assert whole_stream(windowed, settings, cnv, end) == want
        assert get(windowed, settings, f"/{cnv}").json() == get(full, settings, f"/{cnv}").json()

    assert held(windowed, settings) == {"in_memory": CONVERSATIONS, "held": 0}

    # Written through the windowed edge: an old conversation takes messages there too.
    r = send(windowed, settings, convs[0], "One more thing: the bus stop sign fell over.")
    assert r.status_code == 202, r.text
    replied(windowed, settings, r.json()["turn"])
    end = last_seq(full, settings, convs[0])
    assert whole_stream(windowed, settings, convs[0], end) == \
        whole_stream(full, settings, convs[0], end)

    # A conversation started after the windowed edge: it is in its window, read by its tail.
    fresh = create(full, settings)
    r = wait_for(lambda: (g := get(windowed, settings, f"/{fresh}")).status_code == 200 and g,
                 timeout=30, what="the new conversation on the windowed edge")
    assert r.json() == get(full, settings, f"/{fresh}").json()

    # Still 404: an id no one created, and someone else's conversation.
    assert get(windowed, settings, "/cnv-0123456789abcdef").status_code == 404
    other = httpx.get(f"{windowed}/me/conversations/{convs[2]}", timeout=10,
                      headers=auth(settings, "bob"))
    assert other.status_code == 404

    # Unused for the window, every view is evicted; asked for again, each is read again from
    # the log and served exactly as before.
    wait_for(lambda: held(windowed, settings)["in_memory"] == 0, timeout=30,
             what="the unused conversations evicted")
    for cnv in (*convs, fresh):
        end = last_seq(full, settings, cnv)
        assert whole_stream(windowed, settings, cnv, end) == whole_stream(full, settings, cnv, end)
