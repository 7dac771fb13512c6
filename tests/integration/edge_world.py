"""One running stack per test module, and the world the edge's contract tests stand on (no tests
here): a worker and an edge on the session's broker, tokens for every principal, and one of
each resource the routes name, owned by ``alice`` in tenant ``t1``.

Shared by the authorization matrix (``test_authz_matrix.py``) and the OpenAPI fuzzing
(``test_openapi_fuzz.py``), so both put the same real ids into the same paths.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt

from schemas.workflow import WorkflowStarted
from streams.capabilities import ROLES, Role
from streams.envelope import Envelope
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import WORKFLOWS
from tests.integration.test_staff_helpers import produce
from tests.support import (
    settings_with_topics,
    spawn_voice,
    stop,
    wait_group_stable,
    wait_http_ready,
    worker_group,
)

TENANT = "t1"
"""The tenant every resource of the world belongs to."""
OTHER_TENANT = "t2"
OWNER = "alice"
"""The participant who owns the world's conversations, chat, dataset and contribution."""

TOKEN_TTL_S = 900
"""Well under any maximum lifetime a deployment sets, well over a module's run."""

CSV = b"state,count\nCA,3\nNY,5\n"
PLAIN = "The lights on the corner of the road have been broken since March."


def role_sub(role: Role, tenant: str) -> str:
    """The subject of the world's principal with ``role`` in ``tenant`` (``staff-t1``)."""
    return f"{role}-{tenant}"


def token(settings: VoiceSettings, sub: str, role: Role, tenant: str | None,
          memberships: dict[str, str] | None = None) -> str:
    """A good token: ``sub`` with ``role`` in ``tenant`` (and ``memberships``)."""
    return mint_token(settings, sub, role, tenant, ttl_s=TOKEN_TTL_S, memberships=memberships)


def role_tokens(settings: VoiceSettings, tenant: str = TENANT) -> dict[Role, str]:
    """A good token for each role in ``tenant``; the participant's is the owner's."""
    return {role: token(settings, OWNER if role == "participant" else role_sub(role, tenant),
                        role, tenant) for role in ROLES}


def resign(settings: VoiceSettings, good: str, *, secret: str | None = None,
           **claims: Any) -> str:
    """``good``'s claims with ``claims`` changed, signed again with the deployment's secret (or
    ``secret``): whatever ``mint_token`` adds, only the named claims differ."""
    payload = jwt.decode(good, options={"verify_signature": False})
    payload.update(claims)
    key = secret if secret is not None else settings.jwt_secret.get_secret_value()
    return jwt.encode(payload, key, algorithm=settings.jwt_algorithms[0])


def bad_tokens(settings: VoiceSettings, good: str) -> dict[str, str | None]:
    """Tokens the edge must refuse (401), each ``good`` broken one way; None: no token at all."""
    now = int(time.time())
    unsigned = jwt.decode(good, options={"verify_signature": False})
    return {
        "no token": None,
        "expired": resign(settings, good, iat=now - 7200, exp=now - 3600),
        "alg none": jwt.encode(unsigned, None, algorithm="none"),
        "wrong aud": resign(settings, good, aud="https://not-this-deployment.invalid"),
        "wrong iss": resign(settings, good, iss="https://issuer.invalid"),
        "bad signature": resign(settings, good, secret="another-secret-" + "x" * 32),
        "empty sub": resign(settings, good, sub=""),
        "unknown role": resign(settings, good, role="admin"),
        "ten-year lifetime": resign(settings, good, iat=now, exp=now + 10 * 365 * 86400),
    }


# --- the stack --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    """A worker and an edge on their own topics of the session's broker."""

    settings: VoiceSettings
    url: str
    logs: Path


@contextmanager
def running_stack(bootstrap: str, tmp: Path, simulator_url: str, **edge_env: str
                  ) -> Iterator[Stack]:
    """Start a worker and an edge (both at once, to save time); stop both at the end."""
    from deploy.kafka_local import free_port

    settings = settings_with_topics(bootstrap, tmp)
    port = free_port()
    worker = spawn_voice(settings, "worker", log=tmp / "worker.log",
                         ANTHROPIC_API_KEY="simulator", ANTHROPIC_BASE_URL=simulator_url)
    edge = spawn_voice(settings, "edge", "--port", str(port), log=tmp / "edge.log", **edge_env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_group_stable(settings, worker_group(settings))
        wait_http_ready(f"{url}/readyz", proc=edge)
        yield Stack(settings, url, tmp)
    finally:
        stop(edge)
        stop(worker)


@dataclass(frozen=True)
class Hosts:
    """Edges and workers as if each ran on its own host: one broker, nothing else shared."""

    settings: VoiceSettings
    urls: list[str]
    """Each edge's base URL, in start order."""
    edges: list[subprocess.Popen[bytes]]
    workers: list[subprocess.Popen[bytes]]
    state_dirs: list[Path]
    """Each process's own ``VOICE_STATE_DIR`` (edges first, then workers)."""


@contextmanager
def running_hosts(bootstrap: str, tmp: Path, simulator_url: str, edges: int = 2,
                  workers: int = 2) -> Iterator[Hosts]:
    """Start ``edges`` edges and ``workers`` workers, each with its own state folder (and
    working directory), on fresh topics of the session's broker; stop them all at the end."""
    from deploy.kafka_local import free_port

    settings = settings_with_topics(bootstrap, tmp)
    started: list[subprocess.Popen[bytes]] = []
    dirs: list[Path] = []

    def own_dir(name: str) -> VoiceSettings:
        folder = tmp / name
        folder.mkdir()
        dirs.append(folder)
        return settings.model_copy(update={"state_dir": folder})

    try:
        ports = [free_port() for _ in range(edges)]
        edge_procs = [spawn_voice(own_dir(f"edge-{i}"), "edge", "--port", str(port),
                                  log=tmp / f"edge-{i}.log") for i, port in enumerate(ports)]
        started += edge_procs
        worker_procs = [spawn_voice(own_dir(f"worker-{i}"), "worker", log=tmp / f"worker-{i}.log",
                                    ANTHROPIC_API_KEY="simulator",
                                    ANTHROPIC_BASE_URL=simulator_url) for i in range(workers)]
        started += worker_procs
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url, proc in zip(urls, edge_procs, strict=True):
            wait_http_ready(f"{url}/readyz", proc=proc, timeout=120)
        wait_group_members(settings, worker_group(settings), workers)
        yield Hosts(settings, urls, edge_procs, worker_procs, dirs)
    finally:
        for proc in started:
            stop(proc)


def wait_group_members(settings: VoiceSettings, group: str, members: int,
                       timeout: float = 120) -> None:
    """Wait until ``group`` is stable with ``members`` members, each assigned partitions."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            desc = admin.describe_consumer_groups([group])[group].result(timeout=5)
            if (str(desc.state).endswith("STABLE") and len(desc.members) == members
                    and all(m.assignment.topic_partitions for m in desc.members)):
                return
        except Exception:  # the group does not exist yet
            pass
        time.sleep(0.5)
    raise TimeoutError(f"consumer group {group!r} without {members} assigned members "
                       f"in {timeout}s")


# --- the world's resources --------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """One of each resource a route names, all in tenant ``t1``; the participant ones are the
    owner's. Field names are what the route table's ``at`` maps path parameters to."""

    conversation: str
    turn: str
    erasable: str
    """Another conversation of the owner's, for a run that erases one and goes on."""
    chat: str
    chat_turn: str
    dataset: str
    erasable_chat: str
    """Another chat of the owner's, and an upload and a contribution, for the same reason."""
    erasable_dataset: str
    issue: str
    contribution: str
    """In review, waiting for its (single) reviewer."""
    erasable_contribution: str
    run: str
    """A research run that is done."""
    investigation: str
    """Suggested by ``run``, not yet open."""
    failed_workflow: str
    notification: str
    """In the owner's inbox."""


class SetupError(AssertionError):
    """The world could not be built; the message says which step."""


@dataclass
class Caller:
    """Calls the edge with one principal's token, for the setup."""

    client: httpx.AsyncClient
    token: str

    async def call(self, method: str, path: str, status: int, **kwargs: Any) -> Any:
        r = await self.client.request(method, path, headers={
            "Authorization": f"Bearer {self.token}"}, **kwargs)
        if r.status_code != status:
            raise SetupError(f"{method} {path}: expected {status}, got {r.status_code}: "
                             f"{r.text[:300]}")
        return r.json() if r.content else None

    async def until(self, path: str, check: Callable[[Any], Any], what: str,
                    timeout: float = 60, **params: Any) -> Any:
        """GET ``path`` until ``check(json)`` is truthy; returns that value."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            r = await self.client.get(path, params=params,
                                      headers={"Authorization": f"Bearer {self.token}"})
            last = r
            if r.status_code == 200 and (found := check(r.json())):
                return found
            await asyncio.sleep(0.25)
        raise SetupError(f"{what}: not reached in {timeout}s (last: {last and last.status_code} "
                         f"{last and last.text[:300]})")


async def _participant_side(owner: Caller) -> dict[str, str]:
    conversation = (await owner.call("POST", "/me/conversations", 201))["conversation"]
    sent = await owner.call("POST", f"/me/conversations/{conversation}/messages", 202,
                            json={"text": "The streetlights on Elm Road are broken."})
    erasable = (await owner.call("POST", "/me/conversations", 201))["conversation"]
    dataset = (await owner.call("POST", "/api/v1/assistant/files", 201,
                                files={"file": ("lights.csv", CSV, "text/csv")}))["dataset_id"]
    chat = await owner.call("POST", "/api/v1/assistant/chat", 202, json={
        "message": "How many rows are there?", "data_refs": [dataset], "stream": False})
    chat_id, chat_turn = chat["conversation_id"], chat["turn"]
    erasable_dataset = (await owner.call("POST", "/api/v1/assistant/files", 201, files={
        "file": ("erase.csv", CSV, "text/csv")}))["dataset_id"]
    erasable_chat = (await owner.call("POST", "/api/v1/assistant/chat", 202, json={
        "message": "Nothing to keep.", "stream": False}))["conversation_id"]
    # A turn still running makes the next chat in it 409 (busy): the matrix's chat needs it idle.
    await owner.until(f"/api/v1/assistant/conversations/{chat_id}/turns/{chat_turn}",
                      lambda j: j["state"] != "Thinking", "the chat turn to end")
    return {"conversation": conversation, "turn": sent["turn"], "erasable": erasable,
            "chat": chat_id,
            "chat_turn": chat_turn, "dataset": dataset, "erasable_chat": erasable_chat,
            "erasable_dataset": erasable_dataset}


async def _issue_side(owner: Caller, staff: Caller, reviewer: Caller, operator: Caller,
                      forge: Callable[[Envelope], Awaitable[None]]) -> dict[str, str]:
    issue = (await staff.call("POST", "/staff/issues", 201,
                              json={"title": "Streetlights on Elm Road are broken"}))["issue"]
    await staff.call("POST", f"/staff/issues/{issue}/evidence", 201,
                     json={"title": "A resident", "body": "Three lights are out since March."})
    await owner.call("POST", f"/me/issues/{issue}/follow", 200)
    await staff.call("POST", f"/staff/issues/{issue}/developments", 202,
                     json={"title": "Repairs ordered", "body": "The council ordered repairs."})
    contribution = (await owner.call("POST", f"/me/issues/{issue}/contributions", 202,
                                     json={"text": PLAIN}))["contribution"]
    erasable_contribution = (await owner.call("POST", f"/me/issues/{issue}/contributions", 202,
                                              json={"text": PLAIN}))["contribution"]
    run = (await staff.call("POST", f"/staff/issues/{issue}/research", 202))["run"]
    failed = await _failed_workflow(operator, forge)
    await reviewer.until("/staff/reviews", lambda items: any(
        i["contribution"] == contribution and i["waiting_for"] == "review" for i in items),
        "the contribution to wait for its review", state="waiting")
    await reviewer.until("/staff/reviews/queue", lambda q: any(
        i["contribution"] == contribution for i in q["waiting"]),
        "the contribution in the tenant's review queue")
    done = await staff.until(f"/staff/research/{run}", lambda j: j["state"] != "Running" and j,
                             "the research run to end")
    if done["state"] != "Done" or not done["suggestions"]["investigations"]:
        raise SetupError(f"the research run did not suggest an investigation: {done}")
    notification = await owner.until("/me/inbox", lambda j: j["notifications"] and
                                      j["notifications"][0]["notification"],
                                      "the development to reach the owner's inbox")
    return {"issue": issue, "contribution": contribution,
            "erasable_contribution": erasable_contribution, "run": run,
            "investigation": done["suggestions"]["investigations"][0]["investigation"],
            "failed_workflow": failed, "notification": notification}


async def _failed_workflow(operator: Caller, forge: Callable[[Envelope], Awaitable[None]]
                           ) -> str:
    """A research run of tenant t1 whose input lacks its issue, so its one step fails every
    attempt and the workflow fails: the only way to fail a workflow without a failing model,
    which would fail every other workflow of the module's one worker too."""
    workflow = f"run-{uuid.uuid4().hex[:16]}"
    started = WorkflowStarted(workflow=workflow, kind="research", input={
        "run": workflow, "requested_by": role_sub("staff", TENANT), "tenant": TENANT})
    await forge(Envelope(record=started, key=workflow, source="/test/matrix", subject=workflow,
                         tenant=TENANT, seq=1, correlation=workflow, id=f"{workflow}:1"))
    await operator.until(f"/staff/workflows/{workflow}", lambda j: j["status"] == "failed",
                         "the broken research run to fail")
    return workflow


async def build_resources(stack: Stack) -> Resources:
    """Create the world's resources through the edge (the failed workflow excepted), waiting
    only for what a route's success needs: the chat idle, the contribution waiting for review,
    the research run done, the owner's notification delivered, the broken run failed."""
    settings = stack.settings
    tokens = role_tokens(settings)

    async def forge(env: Envelope) -> None:
        await asyncio.to_thread(produce, settings, WORKFLOWS, env)

    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        def caller(role: Role) -> Caller:
            return Caller(client, tokens[role])

        mine, issues = await asyncio.gather(
            _participant_side(caller("participant")),
            _issue_side(caller("participant"), caller("staff"), caller("reviewer"),
                        caller("operator"), forge))
    return Resources(**mine, **issues)
