"""Erasing an assistant chat, an uploaded dataset and a contribution, on the real broker.

One worker and one edge for the module (``edge_world.running_stack``). The owner makes one of
each (and a chat that keeps working beside them); a participant of the same tenant and the same
subject in another tenant try to erase each first (404, and nothing is erased); then the owner
erases each (204). Each test then shows, for one of the three: the edge answers as for an
unknown id; the sealed bytes still on its topic no longer open (a fresh sealer, the key gone);
the log ends with the erasure, and nothing landed after it. The last test starts a second edge
after the erasures and shows it refuses all three while it serves what was kept.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from deploy.kafka_local import free_port
from deploy.processes import spawn_voice, stop, wait_http_ready
from schemas.assistant import (
    AssistantConversationErased,
    AssistantTurnRequested,
    DatasetErased,
    DatasetRecorded,
)
from schemas.staff import ContributionErased, ContributionRecorded
from streams.sealing import KeyErased, sealer_for
from streams.topics import ASSISTANT, CONTRIBUTIONS, DATASETS
from tests.integration.edge_world import (
    CSV,
    OTHER_TENANT,
    OWNER,
    PLAIN,
    TENANT,
    Caller,
    Stack,
    running_stack,
    token,
)
from tests.support import log_of

pytestmark = pytest.mark.integration

CHAT = "/api/v1/assistant/chat"
TURN_ENDED_S = 120
"""Bound on a simulated turn (or a review step) ending on a loaded 2-core machine."""


@dataclass(frozen=True)
class World:
    """What the module made, erased and kept."""

    chat: str
    """The erased chat, and its first turn (perhaps still running when it was erased)."""
    chat_turn: str
    dataset: str
    """The erased upload (read by ``kept_chat``'s first turn before it was erased)."""
    issue: str
    contribution: str
    kept_chat: str
    kept_turn: str
    kept_dataset: str


MODEL_LATENCY_MS = 3000
"""Each simulated model call takes this long, so the chat erased right after its message is
(all but surely) erased while its turn runs: the case that must end cleanly."""


@pytest.fixture(scope="module")
def slow_simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = open(tmp_path_factory.mktemp("slow-sim") / "sim.log", "ab")  # noqa: SIM115
    sim = subprocess.Popen([sys.executable, "-m", "deploy.cli", "simulator", "--port", str(port)],
                           env={**os.environ, "VOICE_SIMULATOR_LATENCY_MS": str(MODEL_LATENCY_MS)},
                           stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/health", proc=sim)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(sim)
        log.close()


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, slow_simulator: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:
    with running_stack(kafka_bootstrap, tmp_path_factory.mktemp("erasure"), slow_simulator) as s:
        yield s


def callers(stack: Stack, client: httpx.AsyncClient) -> dict[str, Caller]:
    s = stack.settings
    return {"owner": Caller(client, token(s, OWNER, "participant", TENANT)),
            "neighbour": Caller(client, token(s, "bob", "participant", TENANT)),
            "foreign": Caller(client, token(s, OWNER, "participant", OTHER_TENANT)),
            "staff": Caller(client, token(s, "staff-t1", "staff", TENANT))}


async def ended(caller: Caller, chat: str, turn: str) -> None:
    await caller.until(f"/api/v1/assistant/conversations/{chat}/turns/{turn}",
                       lambda j: j["state"] != "Thinking", f"turn {turn} to end",
                       timeout=TURN_ENDED_S)


async def make_and_erase(stack: Stack) -> World:
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        who = callers(stack, client)
        owner, staff = who["owner"], who["staff"]
        upload = {"file": ("lights.csv", CSV, "text/csv")}
        dataset = (await owner.call("POST", "/api/v1/assistant/files", 201, files=upload))
        kept_dataset = (await owner.call("POST", "/api/v1/assistant/files", 201, files=upload))
        kept = await owner.call("POST", CHAT, 202, json={
            "message": "How many rows are there?", "data_refs": [dataset["dataset_id"]],
            "stream": False})
        await ended(owner, kept["conversation_id"], kept["turn"])  # the worker read it
        issue = (await staff.call("POST", "/staff/issues", 201,
                                  json={"title": "Streetlights on Elm Road are broken"}))["issue"]
        contribution = (await owner.call("POST", f"/me/issues/{issue}/contributions", 202,
                                         json={"text": PLAIN}))["contribution"]
        # Last, so its turn is in its first model call when it is erased.
        chat = await owner.call("POST", CHAT, 202, json={"message": "Tell me about the lights.",
                                                         "stream": False})
        paths = [f"/api/v1/assistant/conversations/{chat['conversation_id']}",
                 f"/api/v1/assistant/files/{dataset['dataset_id']}",
                 f"/me/issues/{issue}/contributions/{contribution}"]
        # Anyone else, another tenant's same subject included: as for an unknown id.
        for path in paths:
            for name in ("neighbour", "foreign"):
                await who[name].call("DELETE", path, 404)
        # The chat's turn may still be running: its erasure must end it cleanly.
        for path in paths:
            await owner.call("DELETE", path, 204)
        return World(chat=chat["conversation_id"], chat_turn=chat["turn"],
                     dataset=dataset["dataset_id"], issue=issue, contribution=contribution,
                     kept_chat=kept["conversation_id"], kept_turn=kept["turn"],
                     kept_dataset=kept_dataset["dataset_id"])


@pytest.fixture(scope="module")
def world(stack: Stack) -> World:
    return asyncio.run(make_and_erase(stack))


def eventually(check: Callable[[], Any], what: str, timeout: float = TURN_ENDED_S) -> Any:
    """Poll ``check`` (bounded) until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout}s")


def headers(stack: Stack, sub: str = OWNER, role: str = "participant") -> dict[str, str]:
    return {"Authorization": f"Bearer {token(stack.settings, sub, role, TENANT)}"}  # type: ignore[arg-type]


def refuses_chat(url: str, stack: Stack, world: World) -> None:
    """``url``'s edge answers for the erased chat as for an unknown one."""
    base = f"{url}/api/v1/assistant/conversations/{world.chat}"
    h = headers(stack)
    assert httpx.get(f"{base}/turns/{world.chat_turn}", headers=h, timeout=30).status_code == 404
    assert httpx.get(f"{base}/stream", headers=h, timeout=30).status_code == 404
    assert httpx.post(f"{url}{CHAT}", headers=h, timeout=30, json={
        "message": "Still there?", "conversation_id": world.chat,
        "stream": False}).status_code == 404
    assert httpx.delete(base, headers=h, timeout=30).status_code == 404


def refuses_dataset(url: str, stack: Stack, world: World) -> None:
    """``url``'s edge no longer hands the erased upload to any turn."""
    h = headers(stack)
    r = httpx.post(f"{url}{CHAT}", headers=h, timeout=30, json={
        "message": "Count the rows again.", "conversation_id": world.kept_chat,
        "data_refs": [world.dataset], "stream": False})
    assert r.status_code == 404 and "data_refs[0]" in r.json()["detail"], r.text
    assert httpx.delete(f"{url}/api/v1/assistant/files/{world.dataset}", headers=h,
                        timeout=30).status_code == 404


def refuses_contribution(url: str, stack: Stack, world: World) -> None:
    """``url``'s edge shows the erased contribution to nobody: its author, reviewers, readers."""
    staff = headers(stack, "staff-t1", "staff")
    c = world.contribution
    assert httpx.get(f"{url}/staff/contributions/{c}", headers=staff,
                     timeout=30).status_code == 404
    queue = httpx.get(f"{url}/staff/reviews", headers=staff, params={"state": "all"},
                      timeout=30).json()
    assert c not in [i["contribution"] for i in queue]
    published = httpx.get(f"{url}/issues/{world.issue}/contributions", headers=headers(stack),
                          timeout=30)
    assert published.status_code == 200 and c not in str(published.json())
    assert httpx.delete(f"{url}/me/issues/{world.issue}/contributions/{c}",
                        headers=headers(stack), timeout=30).status_code == 404


def workflow_done(stack: Stack, workflow: str, states: tuple[str, ...]) -> str | None:
    """The workflow's status once it is one of ``states`` (as the staff see it), else None."""
    r = httpx.get(f"{stack.url}/staff/workflows/{workflow}",
                  headers=headers(stack, "staff-t1", "staff"), timeout=30)
    status = r.json()["status"] if r.status_code == 200 else None
    return status if status in states else None


# --- the tests --------------------------------------------------------------------------------


def test_an_erased_chat_is_gone_its_running_turn_ended_cleanly_and_its_log_shredded(
        stack: Stack, world: World) -> None:
    refuses_chat(stack.url, stack, world)
    # The turn running at the erasure ends on its worker (it cannot open or seal any more)…
    # (With the slow model it was running, and fails; "completed" is accepted only so a machine
    # too loaded to erase within one model call does not fail the test.)
    eventually(lambda: workflow_done(stack, world.chat_turn, ("failed", "completed")),
               "the erased chat's turn workflow to end")
    # …and the worker goes on: the kept chat still answers.
    h = headers(stack)
    r = httpx.post(f"{stack.url}{CHAT}", headers=h, timeout=30, json={
        "message": "And now?", "conversation_id": world.kept_chat, "stream": False})
    assert r.status_code == 202, r.text
    turn = r.json()["turn"]
    eventually(lambda: httpx.get(
        f"{stack.url}/api/v1/assistant/conversations/{world.kept_chat}/turns/{turn}",
        headers=h, timeout=30).json()["state"] == "Replied", "the kept chat to answer")

    log = log_of(stack.settings, ASSISTANT, world.chat)
    assert isinstance(log[-1].record, AssistantConversationErased)  # nothing appended after
    [requested] = [e.record for e in log if isinstance(e.record, AssistantTurnRequested)]
    fresh = sealer_for(stack.settings)
    try:
        with pytest.raises(KeyErased):
            fresh.open_json(world.chat, requested.message_id, requested.request)
    finally:
        fresh.close()


def test_an_erased_dataset_is_refused_to_every_chat_and_its_bytes_no_longer_open(
        stack: Stack, world: World) -> None:
    refuses_dataset(stack.url, stack, world)
    log = eventually(lambda: (found := log_of(stack.settings, DATASETS, world.dataset))
                     and isinstance(found[-1].record, DatasetErased) and found,
                     "the dataset's erasure on voice.datasets")
    [recorded] = [e.record for e in log if isinstance(e.record, DatasetRecorded)]
    fresh = sealer_for(stack.settings)
    try:
        with pytest.raises(KeyErased):
            fresh.open_text(world.dataset, "csv", recorded.csv)
        with pytest.raises(KeyErased):
            fresh.open_json(world.dataset, "meta", recorded.meta)
    finally:
        fresh.close()


def test_an_erased_contribution_is_shown_to_nobody_and_its_words_no_longer_open(
        stack: Stack, world: World) -> None:
    refuses_contribution(stack.url, stack, world)
    # Its review either failed (the text no longer opened) or waits for a review no one can
    # give any more (the contribution answers 404 to reviewers): either way it records nothing.
    eventually(lambda: workflow_done(stack, world.contribution, ("failed", "paused")),
               "the erased contribution's review to stop")
    log = log_of(stack.settings, CONTRIBUTIONS, world.contribution)
    assert isinstance(log[-1].record, ContributionErased), [e.type for e in log]
    submitted = next(e.record for e in log if isinstance(e.record, ContributionRecorded))
    fresh = sealer_for(stack.settings)
    try:
        with pytest.raises(KeyErased):
            fresh.open_text(world.contribution, "text", submitted.text)
    finally:
        fresh.close()


def test_an_edge_started_after_the_erasures_refuses_all_three(
        stack: Stack, world: World, tmp_path_factory: pytest.TempPathFactory) -> None:
    port = free_port()
    edge = spawn_voice(stack.settings, "edge", "--port", str(port),
                       log=tmp_path_factory.mktemp("later-edge") / "edge.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(f"{url}/readyz", proc=edge, timeout=120)  # caught up with every log
        h = headers(stack)
        # What was kept, it serves: its answers below are not those of an edge that knows
        # nothing yet.
        kept = httpx.get(f"{url}/api/v1/assistant/conversations/{world.kept_chat}/turns/"
                         f"{world.kept_turn}", headers=h, timeout=30)
        assert kept.status_code == 200 and kept.json()["state"] != "Thinking", kept.text
        assert httpx.get(f"{url}/issues/{world.issue}", headers=h, timeout=30).status_code == 200
        refuses_chat(url, stack, world)
        refuses_dataset(url, stack, world)
        refuses_contribution(url, stack, world)
        # The kept upload is still handed to a turn by this edge (so the refusal above is the
        # erasure's, not a dataset view left empty).
        r = httpx.post(f"{url}{CHAT}", headers=h, timeout=30, json={
            "message": "Count these.", "data_refs": [world.kept_dataset], "stream": False})
        assert r.status_code == 202, r.text
    finally:
        stop(edge)
