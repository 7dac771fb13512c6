"""Fault 8 of issue 12: two edges, SSE clients cut at random points, one edge restarted.

Participants' turns run (the real worker on the model simulator) while a client per
conversation follows its stream the way a browser on a flaky network would: it reads a few
events, loses the connection, and reconnects with its last seq to either edge at random. In the
middle, edge B is killed (SIGKILL) and started again on the same port; a client that meets it
down simply tries again. Each client must end with exactly the conversation's events — the
suffix after each of its cursors, every time: no gap, no duplicate, in order, with the same
content as a fresh full read.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.kafka_local import free_port
from deploy.processes import spawn_voice, stop, wait_http_ready
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from tests.support import SseFrame, read_sse, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]

BOUND = "6"
"""The edges' gateway bound: a stream that has caught up ends within it (so a client waiting
at the head reconnects often, as through a real gateway)."""
CONVERSATIONS = 3
MESSAGES = 3
SEED = 20261201


def headers(settings: VoiceSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}


class Edge:
    """An edge on a fixed port, which the test can kill and start again."""

    def __init__(self, settings: VoiceSettings, log: Path) -> None:
        self.settings, self.log, self.port = settings, log, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Any = None
        self.start()

    def start(self) -> None:
        self.proc = spawn_voice(self.settings, "edge", "--port", str(self.port), log=self.log,
                                VOICE_GATEWAY_BOUND_S=BOUND)
        wait_http_ready(f"{self.url}/readyz", proc=self.proc)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def post_turns(settings: VoiceSettings, url: str, conversations: list[str]) -> None:
    """Each conversation's messages, one at a time, each once its previous turn ended."""
    h = headers(settings)
    for n in range(MESSAGES):
        for cnv in conversations:
            key = f"{cnv}-{n}"
            turn = None
            for _ in range(20):  # 503 under load: again, with the same key (recorded once)
                r = httpx.post(f"{url}/me/conversations/{cnv}/messages", headers=h | {
                    "Idempotency-Key": key}, json={"text": f"The lights on street {n} are out"},
                    timeout=20)
                if r.status_code == 202:
                    turn = r.json()["turn"]
                    break
                assert r.status_code == 503, r.text
                time.sleep(0.5)
            assert turn is not None, f"message {key} never accepted"

            def ended(c: str = cnv, t: str = turn) -> bool:
                r = httpx.get(f"{url}/me/conversations/{c}/turns/{t}", headers=h, timeout=10)
                return r.status_code == 200 and r.json()["state"] != "Thinking"

            wait_for(ended, timeout=120, what=f"turn {turn} ended")


def read_some(url: str, settings: VoiceSettings, cnv: str, after: int, cut: int
              ) -> list[SseFrame] | None:
    """Up to ``cut`` events after ``after`` (the stream is dropped there), or None when the
    edge is not there."""
    try:
        s = read_sse("GET", f"{url}/me/conversations/{cnv}/stream", params={"after": after},
                     headers=headers(settings), deadline=30,
                     until=lambda ev: sum(f.id is not None for f in ev) >= cut)
    except (httpx.HTTPError, OSError):
        return None
    if s.status != 200:
        assert s.status in (503, 404), (s.status, s.body)  # 404: an edge just started
        return None
    return [f for f in s.events if f.id is not None]  # deltas are transient, not the log


def test_clients_cut_at_random_on_two_edges_and_a_restart_get_exactly_the_suffix(
        settings: VoiceSettings, start_worker, tmp_path: Path  # noqa: ANN001
) -> None:
    start_worker()
    a, b = Edge(settings, tmp_path / "edge-a.log"), Edge(settings, tmp_path / "edge-b.log")
    h = headers(settings)
    conversations = []
    for _ in range(CONVERSATIONS):
        r = httpx.post(f"{a.url}/me/conversations", headers=h, timeout=20)
        assert r.status_code == 201, r.text
        conversations.append(r.json()["conversation"])
    poster = threading.Thread(target=post_turns, args=(settings, a.url, conversations))
    poster.start()

    rng = random.Random(SEED)
    got: dict[str, list[SseFrame]] = {c: [] for c in conversations}
    cursor = dict.fromkeys(conversations, 0)
    reads = refused = 0
    restarted = False
    final: dict[str, int] = {}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if not poster.is_alive() and not final:
            poster.join()
            for cnv in conversations:  # where each log ends now that every turn is over
                full = read_some(a.url, settings, cnv, 0, 10_000) or []
                final[cnv] = int(full[-1].id) if full else 0
        if final and all(cursor[c] >= final[c] for c in conversations):
            break
        cnv = rng.choice(conversations)
        if final and cursor[cnv] >= final[cnv]:
            continue
        edge = rng.choice((a, b))
        events = read_some(edge.url, settings, cnv, cursor[cnv], rng.randint(1, 4))
        reads += 1
        if events is None:
            refused += 1
            time.sleep(0.2)
            continue
        got[cnv] += events
        if events:
            cursor[cnv] = int(events[-1].id)
        if reads == 12 and not restarted:  # mid-conversation: edge B dies and comes back
            b.kill()
            threading.Thread(target=b.start, daemon=True).start()
            restarted = True
    poster.join(timeout=1)
    assert restarted and final, (reads, final)
    assert all(cursor[c] >= final[c] for c in conversations), (cursor, final)

    for cnv in conversations:
        whole = read_some(b.url, settings, cnv, 0, 10_000)  # the restarted edge, from scratch
        assert whole, cnv
        ids = [int(f.id) for f in got[cnv]]
        assert ids == [int(f.id) for f in whole], (cnv, ids)  # no gap, no duplicate, in order
        assert [(f.event, f.data) for f in got[cnv]] == [(f.event, f.data) for f in whole]
        assert sum(f.event == "message" and f.data["role"] == "agent" for f in whole) == MESSAGES
    b.kill()
    stop(a.proc)
