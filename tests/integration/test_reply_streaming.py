"""A participant's reply streams as the model writes it (issue 13, point 2), on the real broker
with the real worker and edge: ``delta`` events (no ``id:``) arrive before the reply is
recorded, add up to the reply, and a client that reconnects gets the whole reply once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from deploy.kafka_local import free_port
from deploy.processes import stop, wait_http_ready
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from tests.support import SseFrame, read_sse

pytestmark = pytest.mark.integration

ASK = ("The street lights on Oak Street have been out for two weeks and people are afraid to "
       "walk home at night; please can the council fix them")


@pytest.fixture
def slow_model(tmp_path: Path) -> Iterator[str]:
    """The model simulator streaming its reply in 20-character chunks, 60 ms apart."""
    port = free_port()
    env = {**__import__("os").environ, "VOICE_SIMULATOR_CHUNK_DELAY_MS": "60"}
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "simulator", "--port",
                             str(port)], env=env, stdout=open(tmp_path / "slow-sim.log", "ab"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http_ready(f"{url}/health", proc=proc)
    yield url
    stop(proc)


def auth(settings: VoiceSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}


def stream(url: str, settings: VoiceSettings, cnv: str, after: int,
           until: Callable[[list[SseFrame]], bool]) -> list[SseFrame]:
    s = read_sse("GET", f"{url}/me/conversations/{cnv}/stream", params={"after": after},
                 headers=auth(settings), until=until, deadline=60)
    assert s.status == 200, s.body
    return s.events


def replied(events: list[SseFrame]) -> bool:
    return any(f.event == "turn" and f.data["state"] == "Replied" for f in events)


def start_turn(url: str, settings: VoiceSettings) -> tuple[str, str]:
    r = httpx.post(f"{url}/me/conversations", headers=auth(settings), timeout=10)
    assert r.status_code == 201, r.text
    cnv = r.json()["conversation"]
    r = httpx.post(f"{url}/me/conversations/{cnv}/messages", json={"text": ASK},
                   headers=auth(settings), timeout=10)
    assert r.status_code == 202, r.text
    return cnv, r.json()["turn"]


def read_until_replied(url: str, settings: VoiceSettings, cnv: str, after: int
                       ) -> list[SseFrame]:
    """Reconnect until the turn's Replied arrived (each stream ends at the gateway bound)."""
    out: list[SseFrame] = []
    for _ in range(10):
        got = stream(url, settings, cnv, after, replied)
        out += got
        if replied(out):
            return out
        ids = [int(f.id) for f in got if f.id is not None]
        after = max(ids, default=after)
    raise AssertionError(f"no Replied; got {[f.event for f in out]}")


def joined(deltas: list[SseFrame]) -> str:
    """The shown text the deltas add up to, checking each starts where the last ended."""
    text = ""
    for f in deltas:
        assert f.id is None and f.data["attempt"] == 1
        assert f.data["offset"] == len(text), (f.data["offset"], len(text))
        text += f.data["text"]
    return text


def test_the_reply_streams_before_it_is_recorded_and_adds_up_to_it(
        settings: VoiceSettings, start_worker, start_edge, slow_model: str  # noqa: ANN001
) -> None:
    start_worker(ANTHROPIC_BASE_URL=slow_model)
    url = start_edge()
    cnv, turn = start_turn(url, settings)
    events = read_until_replied(url, settings, cnv, after=0)
    kinds = [f.event for f in events]
    reply = next(f for f in events if f.event == "message" and f.data["role"] == "agent")
    deltas = [f for f in events if f.event == "delta"]
    assert len(deltas) >= 3, kinds  # streamed in pieces ...
    assert kinds.index("delta") < kinds.index("message", kinds.index("delta") - 1)
    assert all(kinds.index("delta") < i for i, f in enumerate(events) if f is reply)
    assert all(f.data["turn"] == turn for f in deltas)
    assert joined(deltas) == reply.data["text"]  # ... that add up to the recorded reply

    # A client that reconnects after the turn has the reply once, and no delta.
    message_seq = next(int(f.id) for f in events if f.event == "message")
    again = stream(url, settings, cnv, message_seq, replied)
    assert [f.event for f in again].count("message") == 1 and "delta" not in {
        f.event for f in again}
    assert next(f for f in again if f.event == "message").data["text"] == reply.data["text"]


def test_a_client_cut_mid_reply_gets_every_event_once_and_the_reply_whole(
        settings: VoiceSettings, start_worker, start_edge, slow_model: str  # noqa: ANN001
) -> None:
    start_worker(ANTHROPIC_BASE_URL=slow_model)
    url = start_edge()
    cnv, _turn = start_turn(url, settings)
    first = stream(url, settings, cnv, 0,
                   lambda ev: sum(f.event == "delta" for f in ev) >= 2)  # cut mid-reply
    assert not replied(first)
    last = max(int(f.id) for f in first if f.id is not None)
    rest = read_until_replied(url, settings, cnv, after=last)
    ids = [int(f.id) for f in first + rest if f.id is not None]
    whole = [int(f.id) for f in stream(url, settings, cnv, 0, replied) if f.id is not None]
    assert ids == whole  # no gap, no duplicate
    replies = [f for f in first + rest if f.event == "message" and f.data["role"] == "agent"]
    assert len(replies) == 1
    resent = [f for f in rest if f.event == "delta"]
    if resent:  # the deltas still held are sent again from the start of the reply
        assert replies[0].data["text"].startswith(joined(resent))
