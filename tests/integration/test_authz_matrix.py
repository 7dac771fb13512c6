"""The authorization matrix: every route of the edge × every kind of caller → the exact status.

``ROUTES`` is the one table of expectations: for each operation, the capability it requires
(``streams.capabilities``) and whose resource its path names — the owner's (participant data),
the tenant's (issues, contributions, workflows, runs, investigations), the caller's own space
(creating, listing, the inbox) or nobody's (ops and docs). Each case's status is derived from
that row by ``expected``:

- a public route answers every caller alike;
- any token the edge cannot trust (none, expired, ``alg: none``, wrong ``aud`` or ``iss``, bad
  signature, empty ``sub``, an unbounded lifetime) → 401;
- ``X-Tenant-ID`` naming a tenant the bearer is not a member of → 403;
- a role without the capability → 403;
- someone else's resource, another tenant's included → 404, never 403 (the answer must not
  reveal that it exists);
- otherwise the route's success status. Listings also must show the world's resource to exactly
  those who may see it.

An operation of the OpenAPI without a row fails ``test_every_operation_has_a_row``, so a route
added without deciding who may call it fails the suite.

The world (``edge_world``): one worker and one edge for the module, one of each resource owned by
``alice`` in tenant ``t1``. Cases run concurrently; a route that changes its resource (a review,
a retry, opening an investigation, a chat turn, cancelling) runs after every read, its success
case first, so a case wrongly let through cannot change what another case expects; erasing runs
last, its success case last (after an erase everyone's answer is 404, a wrong one's included).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from api.app import create_app
from streams.capabilities import ROLES, Capability, Role, resolve_capabilities
from streams.settings import VoiceSettings
from tests.integration.edge_world import (
    CSV,
    OTHER_TENANT,
    OWNER,
    TENANT,
    Resources,
    Stack,
    bad_tokens,
    build_resources,
    role_sub,
    running_stack,
    token,
)

pytestmark = pytest.mark.integration

Scope = Literal["owner", "tenant", "caller", "public"]
"""Whose resource an operation's path names: ``owner`` — the owner's (anyone else: 404);
``tenant`` — tenant t1's (another tenant: 404); ``caller`` — the caller's own space (creating,
its own listings): no one else's resource; ``public`` — no token needed."""

Phase = Literal["read", "change", "erase"]
"""When a route's cases run: ``read`` all at once first; ``change`` (the route changes the
resource its success case needs) one route at a time, its success case first; ``erase`` last,
its success case last."""


@dataclass(frozen=True)
class Ref:
    """In a row's body: the id of the ``Resources`` field ``name``."""

    name: str


@dataclass(frozen=True)
class Row:
    """What one operation requires, and the request each case sends."""

    capability: Capability | None
    scope: Scope
    ok: int
    """The status of a caller who may."""
    at: dict[str, str] = field(default_factory=dict)
    """Path parameter → the ``Resources`` field whose id fills it."""
    json: dict[str, Any] | None = None
    """The JSON body; a ``Ref`` in it is replaced by the world's id it names."""
    params: dict[str, str] | None = None
    upload: bool = False
    """A multipart CSV upload as the body."""
    sse: bool = False
    """An event stream: only its status and headers are read."""
    phase: Phase = "read"
    shows: tuple[str, Scope] | None = None
    """A listing: the ``Resources`` field that must be in its body exactly for the callers who
    may see that resource (its scope)."""


CONVERSATION = {"conversation": "conversation"}
TURN = {"conversation": "conversation", "turn": "turn"}
CHAT = {"conversation": "chat"}
CHAT_TURN = {"conversation": "chat", "turn": "chat_turn"}
ISSUE = {"issue": "issue"}
TEXT = {"text": "Matrix case: the lights are still out."}
NOTE = {"title": "Matrix case", "body": "Recorded by the authorization matrix."}

# The one table. Rows are keyed by (method, path template), as the OpenAPI names operations.
ROUTES: dict[tuple[str, str], Row] = {
    # --- participant conversations (api/conversations) ---
    ("POST", "/me/conversations"): Row("converse", "caller", 201),
    ("GET", "/me/conversations"): Row("converse", "caller", 200,
                                      shows=("conversation", "owner")),
    ("GET", "/me/conversations/{conversation}"): Row("converse", "owner", 200, CONVERSATION),
    ("POST", "/me/conversations/{conversation}/messages"): Row(
        "converse", "owner", 202, CONVERSATION, json=TEXT),
    ("GET", "/me/conversations/{conversation}/turns/{turn}"): Row("converse", "owner", 200, TURN),
    ("GET", "/me/conversations/{conversation}/stream"): Row(
        "converse", "owner", 200, CONVERSATION, sse=True),
    ("POST", "/me/conversations/{conversation}/turns/{turn}/cancel"): Row(
        "converse", "owner", 202, TURN, phase="change"),
    ("DELETE", "/me/conversations/{conversation}"): Row(
        "converse", "owner", 204, CONVERSATION, phase="erase"),
    # --- the assistant chat (api/assistant) ---
    ("POST", "/api/v1/assistant/files"): Row("converse", "caller", 201, upload=True),
    # In the owner's chat, with the owner's dataset: someone else's chat is 404.
    ("POST", "/api/v1/assistant/chat"): Row("converse", "owner", 202, json={
        "message": "And how many columns?", "conversation_id": Ref("chat"),
        "data_refs": [Ref("dataset")], "stream": False}, phase="change"),
    ("GET", "/api/v1/assistant/conversations/{conversation}/turns/{turn}"): Row(
        "converse", "owner", 200, CHAT_TURN),
    ("GET", "/api/v1/assistant/conversations/{conversation}/stream"): Row(
        "converse", "owner", 200, CHAT, sse=True),
    ("POST", "/api/v1/assistant/conversations/{conversation}/turns/{turn}/cancel"): Row(
        "converse", "owner", 202, CHAT_TURN, phase="change"),
    ("DELETE", "/api/v1/assistant/conversations/{conversation}"): Row(
        "converse", "owner", 204, {"conversation": "erasable_chat"}, phase="erase"),
    ("DELETE", "/api/v1/assistant/files/{file_id}"): Row(
        "converse", "owner", 204, {"file_id": "erasable_dataset"}, phase="erase"),
    # --- issues as participants see them (api/staff/contributions, inbox) ---
    ("GET", "/issues/{issue}"): Row("issues.public", "tenant", 200, ISSUE),
    ("GET", "/issues/{issue}/contributions"): Row("issues.public", "tenant", 200, ISSUE),
    # Following changes what ``GET /me/issues`` lists: after every read.
    ("GET", "/me/issues"): Row("issues.public", "caller", 200, shows=("issue", "owner")),
    ("POST", "/me/issues/{issue}/follow"): Row("issues.public", "tenant", 200, ISSUE,
                                               phase="change"),
    ("DELETE", "/me/issues/{issue}/follow"): Row("issues.public", "tenant", 200, ISSUE,
                                                 phase="change"),
    ("POST", "/me/issues/{issue}/contributions"): Row("contribute", "tenant", 202, ISSUE,
                                                      json=TEXT),
    # Its author's alone: staff reject in review, they do not erase.
    ("DELETE", "/me/issues/{issue}/contributions/{contribution}"): Row(
        "contribute", "owner", 204, {"issue": "issue", "contribution": "erasable_contribution"},
        phase="erase"),
    ("GET", "/me/inbox"): Row("issues.public", "caller", 200, shows=("notification", "owner")),
    ("GET", "/me/inbox/stream"): Row("issues.public", "caller", 200, sse=True,
                                     shows=("notification", "owner")),
    # --- staff (api/staff) ---
    ("POST", "/staff/issues"): Row("issues.manage", "caller", 201, json={"title": "Matrix"}),
    ("GET", "/staff/issues"): Row("issues.read", "caller", 200, shows=("issue", "tenant")),
    ("GET", "/staff/issues/{issue}"): Row("issues.read", "tenant", 200, ISSUE),
    ("POST", "/staff/issues/{issue}/evidence"): Row("issues.manage", "tenant", 201, ISSUE,
                                                    json=NOTE),
    ("POST", "/staff/issues/{issue}/developments"): Row("issues.manage", "tenant", 202, ISSUE,
                                                        json=NOTE),
    ("POST", "/staff/issues/{issue}/research"): Row("issues.manage", "tenant", 202, ISSUE),
    ("GET", "/staff/research/{run}"): Row("issues.read", "tenant", 200, {"run": "run"}),
    ("POST", "/staff/investigations/{investigation}/open"): Row(
        "investigate", "tenant", 200, {"investigation": "investigation"}, phase="change"),
    ("GET", "/staff/workflows"): Row("workflows.read", "caller", 200,
                                     params={"status": "failed"},
                                     shows=("failed_workflow", "tenant")),
    ("GET", "/staff/workflows/{workflow}"): Row("workflows.read", "tenant", 200,
                                                {"workflow": "run"}),
    ("POST", "/staff/workflows/{workflow}/retry"): Row(
        "workflows.retry", "tenant", 202, {"workflow": "failed_workflow"}, phase="change"),
    ("GET", "/staff/reviews"): Row("reviews.read", "caller", 200, params={"state": "all"},
                                   shows=("contribution", "tenant")),
    ("GET", "/staff/reviews/queue"): Row("reviews.read", "caller", 200,
                                         shows=("contribution", "tenant")),
    ("GET", "/staff/reviews/stream"): Row("reviews.read", "caller", 200, sse=True,
                                          shows=("contribution", "tenant")),
    ("GET", "/staff/contributions/{contribution}"): Row(
        "reviews.read", "tenant", 200, {"contribution": "contribution"}),
    ("POST", "/staff/contributions/{contribution}/review"): Row(
        "reviews.decide", "tenant", 202, {"contribution": "contribution"},
        json={"decision": "approve"}, phase="change"),
    # --- ops and docs: public ---
    ("GET", "/healthz"): Row(None, "public", 200),
    ("GET", "/readyz"): Row(None, "public", 200),
    ("GET", "/ops/edge"): Row("edge.inspect", "caller", 200),
    ("GET", "/openapi.json"): Row(None, "public", 200),
    ("GET", "/docs"): Row(None, "public", 200),
    ("GET", "/docs/oauth2-redirect"): Row(None, "public", 200),
    ("GET", "/redoc"): Row(None, "public", 200),
    # --- the web pages and what they read before anyone signs in: public ---
    ("GET", "/"): Row(None, "public", 200),
    ("GET", "/assistant"): Row(None, "public", 200),
    ("GET", "/staff"): Row(None, "public", 200),
    ("GET", "/web/config"): Row(None, "public", 200),
}


# --- principals -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Principal:
    """A kind of caller: a good token (sub, role, tenant), or a broken one (``bad``)."""

    name: str
    sub: str = OWNER
    role: Role = "participant"
    tenant: str = TENANT
    bad: str | None = None
    """Which way the owner's token is broken (``edge_world.bad_tokens``)."""
    header_tenant: str | None = None
    """``X-Tenant-ID`` sent, naming a tenant the token is not a member of."""
    memberships: dict[str, Role] | None = None
    """The token names no tenant, only these memberships; ``tenant`` is the first one's (the
    resolution chain's choice without a header)."""

    @property
    def is_owner(self) -> bool:
        return self.bad is None and (self.sub, self.tenant) == (OWNER, TENANT)


def principals() -> list[Principal]:
    """Owner, the same sub in the other tenant (by its claim, and by its first membership), each
    role in each tenant (``participant@t1`` is the other participant of the same tenant), a
    foreign ``X-Tenant-ID``, every bad token."""
    out = [Principal("owner"), Principal(f"owner's sub in {OTHER_TENANT}", tenant=OTHER_TENANT)]
    out += [Principal(f"{role}@{tenant}", sub=role_sub(role, tenant), role=role, tenant=tenant)
            for tenant in (TENANT, OTHER_TENANT) for role in ROLES]
    out.append(Principal(f"owner with X-Tenant-ID {OTHER_TENANT}", header_tenant=OTHER_TENANT))
    out.append(Principal(f"owner's sub, staff of {OTHER_TENANT} by first membership",
                         role="staff", tenant=OTHER_TENANT,
                         memberships={OTHER_TENANT: "staff", TENANT: "participant"}))
    out += [Principal(bad, bad=bad) for bad in
            ("no token", "expired", "alg none", "wrong aud", "wrong iss", "bad signature",
             "empty sub", "unknown role", "ten-year lifetime")]
    return out


def may_see(p: Principal, scope: Scope) -> bool:
    """Whether ``p`` may see the world's resource of ``scope`` (given the capability)."""
    if scope == "owner":
        return p.is_owner
    if scope == "tenant":
        return p.tenant == TENANT
    return True


def expected(row: Row, p: Principal) -> int:
    """The status ``p`` must get from the operation ``row`` describes."""
    if row.scope == "public":
        return row.ok
    if p.bad is not None:
        return 401
    if p.header_tenant is not None:
        return 403
    assert row.capability is not None
    if row.capability not in resolve_capabilities(p.role):
        return 403
    return row.ok if may_see(p, row.scope) else 404


# --- running the cases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    principal: Principal
    expected: int
    status: int
    detail: str
    leak: str | None = None
    """What a listing showed (or hid) that it must not have."""

    @property
    def failed(self) -> bool:
        return self.status != self.expected or self.leak is not None

    def line(self) -> str:
        got = f"got {self.status}" + (f" ({self.leak})" if self.leak else "")
        return f"{self.principal.name}: expected {self.expected}, {got} — {self.detail}"


def auth_headers(p: Principal, stack: Stack) -> dict[str, str]:
    settings = stack.settings
    good = (token(settings, p.sub, p.role, None, dict(p.memberships)) if p.memberships
            else token(settings, p.sub, p.role, p.tenant))
    raw = bad_tokens(settings, good)[p.bad] if p.bad else good
    headers = {} if raw is None else {"Authorization": f"Bearer {raw}"}
    if p.header_tenant is not None:
        headers["X-Tenant-ID"] = p.header_tenant
    return headers


def request_for(key: tuple[str, str], row: Row, res: Resources) -> dict[str, Any]:
    """httpx keyword arguments of the operation's request (any caller's)."""
    method, template = key
    path = template.format(**{name: getattr(res, attr) for name, attr in row.at.items()})
    kwargs: dict[str, Any] = {"method": method, "url": path, "params": row.params}
    if row.json is not None:
        kwargs["json"] = filled(row.json, res)
    if row.upload:
        kwargs["files"] = {"file": ("matrix.csv", CSV, "text/csv")}
    return kwargs


def filled(body: Any, res: Resources) -> Any:
    """``body`` with each ``Ref`` replaced by its id."""
    if isinstance(body, Ref):
        return getattr(res, body.name)
    if isinstance(body, dict):
        return {k: filled(v, res) for k, v in body.items()}
    if isinstance(body, list):
        return [filled(v, res) for v in body]
    return body


SSE_LOOK_S = 2.0
"""How long a stream that lists something is read for it (it replays what the edge keeps)."""


async def stream_text(r: httpx.Response, needle: str | None) -> str:
    """What the stream sent until ``needle`` appeared, or for ``SSE_LOOK_S`` at most."""
    text = ""
    if needle is None:
        return text
    try:
        async with asyncio.timeout(SSE_LOOK_S):
            async for chunk in r.aiter_text():
                text += chunk
                if needle in text:
                    break
    except TimeoutError:
        pass
    return text


async def run_case(client: httpx.AsyncClient, stack: Stack, res: Resources,
                   key: tuple[str, str], row: Row, p: Principal) -> Outcome:
    want = expected(row, p)
    kwargs = request_for(key, row, res)
    kwargs["headers"] = auth_headers(p, stack)
    try:
        if row.sse:
            needle = getattr(res, row.shows[0]) if row.shows else None
            async with client.stream(**kwargs) as r:
                status = r.status_code
                body = ((await r.aread()).decode(errors="replace") if status != 200
                        else await stream_text(r, needle))
        else:
            r = await client.request(**kwargs)
            status, body = r.status_code, r.text
    except httpx.HTTPError as exc:
        return Outcome(p, want, 0, f"{type(exc).__name__}: {exc}")
    leak = None
    if row.shows is not None and status == row.ok:
        attr, scope = row.shows
        shown = getattr(res, attr) in body
        if shown != may_see(p, scope):
            leak = (f"lists {attr} {getattr(res, attr)!r} of {OWNER}@{TENANT}" if shown
                    else f"does not list its {attr} {getattr(res, attr)!r}")
    return Outcome(p, want, status, short(body), leak)


def short(body: str) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return body[:120].replace("\n", " ")
    detail = doc.get("detail", doc) if isinstance(doc, dict) else doc
    return json.dumps(detail)[:160]


async def run_matrix(stack: Stack, res: Resources) -> dict[tuple[str, str], list[Outcome]]:
    """Every case of every row, in the phases the rows name (see the module docstring)."""
    people = principals()
    outcomes: dict[tuple[str, str], list[Outcome]] = {key: [] for key in ROUTES}
    limit = asyncio.Semaphore(24)

    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        async def one(key: tuple[str, str], p: Principal) -> None:
            async with limit:
                outcomes[key].append(await run_case(client, stack, res, key, ROUTES[key], p))

        async def cases(keys: list[tuple[str, str]], allowed_first: bool = True) -> None:
            allowed = [(k, p) for k in keys for p in people
                       if expected(ROUTES[k], p) == ROUTES[k].ok]
            others = [(k, p) for k in keys for p in people if (k, p) not in allowed]
            for batch in (allowed, others) if allowed_first else (others, allowed):
                await asyncio.gather(*(one(k, p) for k, p in batch))

        # Who may goes first, so a case wrongly let through cannot take their resource (it
        # then gets a status of its own: 409 not waiting, 202 already ended, busy…) — except
        # for an erase, after which anyone's answer is 404: there the others go first, and
        # one wrongly let through erases it before the owner (204 for them, 404 for the owner).
        await cases([k for k, row in ROUTES.items() if row.phase == "read"])
        for key in [k for k, row in ROUTES.items() if row.phase == "change"]:
            await cases([key])
        for key in [k for k, row in ROUTES.items() if row.phase == "erase"]:
            await cases([key], allowed_first=False)
    order = {p.name: n for n, p in enumerate(people)}
    return {k: sorted(v, key=lambda o: order[o.principal.name]) for k, v in outcomes.items()}


def matrix_markdown() -> str:
    """``ROUTES`` as the Markdown table of ``docs/security.md``; print it with
    ``python -c 'import tests.integration.test_authz_matrix as t; print(t.matrix_markdown())'``."""
    scope = {"owner": "the owner's (anyone else: 404)",
             "tenant": "its tenant's (another tenant: 404)",
             "caller": "no id: the caller's own, in its tenant", "public": "public"}
    lines = ["| route | capability | roles with it | resource named | success |",
             "|---|---|---|---|---|"]
    for (method, path), row in ROUTES.items():
        roles = ", ".join(r for r in ROLES if row.capability in resolve_capabilities(r))
        lines.append(f"| `{method} {path}` | {row.capability or '—'} | {roles or 'any caller'} "
                     f"| {scope[row.scope]} | {row.ok} |")
    return "\n".join(lines)


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, simulator_url: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:
    with running_stack(kafka_bootstrap, tmp_path_factory.mktemp("matrix"), simulator_url) as s:
        yield s


@pytest.fixture(scope="module")
def outcomes(stack: Stack) -> dict[tuple[str, str], list[Outcome]]:
    res = asyncio.run(build_resources(stack))
    return asyncio.run(run_matrix(stack, res))


# --- tests ------------------------------------------------------------------------------------


def served() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(the operations of the edge's OpenAPI, the routes it serves outside it: docs)."""
    app = create_app(VoiceSettings(env="test", state_dir=Path("/nonexistent")))
    doc = app.openapi()
    operations = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    unlisted = {(method, route.path) for route in app.routes
                for method in getattr(route, "methods", None) or () if method != "HEAD"}
    return operations, unlisted - operations


def test_every_operation_has_a_row() -> None:
    """A route added without deciding who may call it fails here, naming it; so does a row
    for a route the edge no longer serves."""
    operations, unlisted = served()
    missing = sorted(operations - ROUTES.keys())
    assert not missing, f"operations of the OpenAPI without a row in ROUTES: {missing}"
    stale = sorted(ROUTES.keys() - operations - unlisted)
    assert not stale, f"rows of ROUTES the edge does not serve: {stale}"
    undeclared = sorted(k for k in ROUTES.keys() & unlisted if ROUTES[k].scope != "public")
    assert not undeclared, f"routes outside the OpenAPI must be public docs: {undeclared}"


def test_the_table_names_resources_that_exist() -> None:
    """Every path parameter is filled, and from a field of the world's resources."""
    fields = set(Resources.__dataclass_fields__)
    for (method, path), row in ROUTES.items():
        params = {p.split("}")[0] for p in path.split("{")[1:]}
        assert params == set(row.at), (method, path)
        assert set(row.at.values()) <= fields, (method, path)
        assert row.shows is None or row.shows[0] in fields, (method, path)
        assert (row.scope == "public") == (row.capability is None), (method, path)


@pytest.mark.parametrize("key", list(ROUTES), ids=[f"{m} {p}" for m, p in ROUTES])
def test_route(key: tuple[str, str], outcomes: dict[tuple[str, str], list[Outcome]]) -> None:
    """Each caller gets exactly the status the route's row gives it (and listings show the
    world's resource to exactly those who may see it)."""
    failed = [o.line() for o in outcomes[key] if o.failed]
    assert not failed, f"{key[0]} {key[1]}:\n  " + "\n  ".join(failed)
