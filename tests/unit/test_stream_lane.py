"""The stream lane (``api.frame.lane``) answers a conversation stream request exactly as the
route it serves below FastAPI's routing would: the same status and detail for every refusal
(401, 403, 404, 422 naming the field), the same events and final comment for a stream,
and request ids and SSE headers on both. The real app (``create_app``), no broker: one twin
with the lane, one without (the route's own dependencies)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.conversations import ConversationViews
from api.frame.lane import StreamLane
from schemas.conversation import ConversationStarted, TurnStateChanged
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from tests.support import sse_frames

MINE, BOBS = "cnv-0000aaaa", "cnv-0000bbbb"


class Tail:
    def __init__(self) -> None:
        self.assigned, self.caught_up = asyncio.Event(), asyncio.Event()

    def skipped_counts(self) -> dict[str, dict[str, int]]:
        return {}


def started(cnv: str, owner: str) -> Envelope:
    return Envelope(record=ConversationStarted(conversation=cnv, owner=owner), key=cnv,
                    source="/t", seq=1, tenant="default")


def turn(cnv: str, seq: int) -> Envelope:
    return Envelope(record=TurnStateChanged(conversation=cnv, turn=f"{cnv}:t{seq}",
                                            state="Thinking"),
                    key=cnv, source="/t", seq=seq, tenant="default")


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The edge app with the lane and without it, over the same views and keys."""
    settings = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1",
                             state_dir=tmp_path_factory.mktemp("lane"), gateway_bound_s=2.0)
    views = ConversationViews(kept=3)
    sealer = Sealer(MemoryKeyStore())
    for cnv, owner in ((MINE, "alice"), (BOBS, "bob")):
        sealer.create(cnv, "default")
        views.apply(started(cnv, owner))
    for seq in range(2, 7):  # seqs 2..6, the last 3 kept: the oldest cursor served is 3
        views.apply(turn(MINE, seq))
    apps = {}
    for name in ("lane", "routes"):
        app = create_app(settings)
        if name == "routes":
            app.user_middleware = [m for m in app.user_middleware if m.cls is not StreamLane]
        app.state.settings, app.state.views, app.state.sealer = settings, views, sealer
        app.state.tail = Tail()
        apps[name] = TestClient(app)
    return {"settings": settings, **apps}


def token(settings: VoiceSettings, sub: str = "alice", role: Any = "participant") -> str:
    return mint_token(settings, sub, role)


CASES: dict[str, tuple[str, dict[str, str], int]] = {
    # name: (path after /me/conversations/, headers (``{token}`` filled in), status)
    "no token": (f"{MINE}/stream", {}, 401),
    "another scheme": (f"{MINE}/stream", {"Authorization": "Basic YTpi"}, 401),
    "a bad token": (f"{MINE}/stream", {"Authorization": "Bearer not.a.token"}, 401),
    "a malformed tenant": (f"{MINE}/stream", {"X-Tenant-ID": "Not A Tenant!"}, 422),
    "a tenant not the caller's": (f"{MINE}/stream", {"X-Tenant-ID": "elsewhere"}, 403),
    "a role without converse": (f"{MINE}/stream", {"role": "operator"}, 403),
    "a malformed id": ("nope/stream", {}, 404),
    "another's conversation": (f"{BOBS}/stream", {}, 404),
    "a negative cursor": (f"{MINE}/stream?after=-1", {}, 422),
    "a cursor not a number": (f"{MINE}/stream?after=x", {}, 422),
    "a bad Last-Event-ID": (f"{MINE}/stream", {"Last-Event-ID": "x"}, 422),
}


def ask(twins: dict[str, Any], which: str, path: str, headers: dict[str, str]) -> Any:
    """GET ``path`` with ``headers``: a participant's token unless they give ``Authorization``
    (or ``role``: a token of that role)."""
    sent = {k: v for k, v in headers.items() if k != "role"}
    sent.setdefault("Authorization",
                    f"Bearer {token(twins['settings'], role=headers.get('role', 'participant'))}")
    return twins[which].get(f"/me/conversations/{path}", headers=sent)


@pytest.mark.parametrize("case", list(CASES))
def test_the_lane_refuses_as_the_route_does(twins: dict[str, Any], case: str) -> None:
    path, headers, status = CASES[case]
    if case == "no token":
        answers = {w: twins[w].get(f"/me/conversations/{path}") for w in ("lane", "routes")}
    else:
        answers = {w: ask(twins, w, path, headers) for w in ("lane", "routes")}
    for which, r in answers.items():
        assert r.status_code == status, (which, r.text)
        assert r.headers["x-request-id"], which
    lane, route = (answers[w].json() for w in ("lane", "routes"))
    if status == 422:  # the same field named, in the same words (FastAPI names a header
        # once per dependency that reads it: the lane once)
        assert {(tuple(e["loc"]), e["msg"]) for e in lane["detail"]} == \
            {(tuple(e["loc"]), e["msg"]) for e in route["detail"]}
    else:
        assert lane == route


def test_the_lane_streams_what_the_route_streams(twins: dict[str, Any]) -> None:
    bodies = {}
    for which in ("lane", "routes"):
        r = ask(twins, which, f"{MINE}/stream?after=4", {})  # ends by itself near the bound
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache" and r.headers["x-request-id"]
        assert "content-encoding" not in r.headers
        bodies[which] = [(f.id, f.event, tuple(f.comments))
                         for f in sse_frames(r.text.splitlines()) if f.comments != ["keep-alive"]]
    assert bodies["lane"] == bodies["routes"]
    assert [f[0] for f in bodies["lane"] if f[0]] == ["5", "6"]
    assert bodies["lane"][-1][2] == ("end; reconnect with after=6",)


def test_the_lane_serves_only_its_route(twins: dict[str, Any]) -> None:
    settings = twins["settings"]
    auth = {"Authorization": f"Bearer {token(settings)}"}
    assert twins["lane"].post(f"/me/conversations/{MINE}/stream", headers=auth
                              ).status_code == 405
    r = twins["lane"].get(f"/me/conversations/{MINE}", headers=auth)
    assert r.status_code == 200 and r.json()["conversation"] == MINE
