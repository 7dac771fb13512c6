"""Schemathesis over the edge's whole OpenAPI, on a running stack (real broker, worker, edge):
the coverage and fuzzing phases of every operation, with a token for each role, must give no
5xx (``not_a_server_error``), no status the OpenAPI does not declare
(``status_code_conformance``), no body off its declared schema
(``response_schema_conformance``) or media type (``content_type_conformance``).

Real ids go into the paths (``edge_world``'s resources, through the authorization matrix's
``at`` mapping), so no operation is only ever a 404: every case gets them except one whose point
is a path parameter (a coverage or negative case aimed at it). Each case carries one role's
token, chosen from its content (so a case and its replays carry the same one): mostly a role
the operation's row lets in, one case in four any role, for the 403s.

It runs Schemathesis' engine (what ``schemathesis run`` runs; its pytest plugin's lazy
``from_fixture`` breaks on pytest 9.2) once for the module, going on after a failure so that
every kind of failure of an operation shows; then one test per operation reports that
operation's failures, each with the request that reproduces it.

Bounded and deterministic: a fixed seed, ``deterministic`` generation (Hypothesis'
``derandomize``), no example database, one operation at a time, ``MAX_EXAMPLES`` per operation
(no time budget: with one, the engine fuzzes in cycles until it is spent, so the cases would
depend on the machine's speed), a request timeout, a short read of event streams (each also
ends on its own within the gateway bound), and ``RUN_TIMEOUT_S`` for the whole module.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import pytest
import schemathesis
from schemathesis import Case
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from schemathesis.engine import StopReason, events
from schemathesis.schemas import BaseSchema

from api.app import create_app
from streams.capabilities import ROLES, Role, resolve_capabilities
from streams.settings import VoiceSettings
from tests.integration.edge_world import (
    CSV,
    TENANT,
    Resources,
    Stack,
    build_resources,
    role_tokens,
    running_stack,
)
from tests.integration.test_authz_matrix import ROUTES, served

RUN_TIMEOUT_S = 360
"""The run took 137–185 s on a shared 2-core machine before the review queue's two routes, which
add about a minute (its stream's cases are read for up to ``STREAM_READ_S`` each)."""
pytestmark = [pytest.mark.integration, pytest.mark.timeout(RUN_TIMEOUT_S)]

SEED = 20251111
MAX_EXAMPLES = 25
"""Fuzzing examples per operation (the coverage phase's cases come on top)."""
REQUEST_TIMEOUT_S = 20.0
"""Above the gateway bound (15 s), which every response, streams included, ends before."""
STREAM_READ_S = 5.0
"""How long an event stream is read: enough for the events the edge replays at once, and above
the edge's 2 s wait for a conversation it does not know yet (``VIEW_WAIT_S``), whose 404 comes
only then — at 1 s and 3 s, a loaded machine timed out waiting for it."""
GENERATION = {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"}
QUEUE_STREAM_EXAMPLES = 5
"""The review queue's stream takes the same parameters as the inbox's (``after``,
``Last-Event-ID``: the frame's ``cursor_dependency``), whose coverage and fuzzing phases run in
full; each case of it that is let in is read for up to ``STREAM_READ_S`` (its 30 coverage cases
took 55 s), so it gets these fuzzing examples on top of its coverage phase (which holds the
case that reaches its 2xx)."""
CHECKS = ("not_a_server_error", "status_code_conformance", "response_schema_conformance",
          "content_type_conformance")
OWN_RESOURCE = {
    ("DELETE", "/me/conversations/{conversation}"): {"conversation": "erasable"},
    ("DELETE", "/api/v1/assistant/conversations/{conversation}"): {
        "conversation": "erasable_chat"},
    ("DELETE", "/api/v1/assistant/files/{file_id}"): {"file_id": "erasable_dataset"},
    ("DELETE", "/me/issues/{issue}/contributions/{contribution}"): {
        "issue": "issue", "contribution": "erasable_contribution"},
}
"""Paths whose success destroys what they name get a resource of their own, so the operations
tested after them still find the world's."""


def fuzz_config(url: str) -> SchemathesisConfig:
    return SchemathesisConfig.from_dict({
        "seed": SEED,
        "base-url": url,
        # One operation at a time: the order of requests is the same every run, and CPython
        # 3.11's parser is not thread-safe under Hypothesis' code generation.
        "workers": 1,
        "continue-on-failure": True,
        "request-timeout": REQUEST_TIMEOUT_S,
        "max-stream-events": 5,
        "generation": GENERATION,
        # No reuse of values read in responses: they hold the world's random ids, so the cases
        # would differ from run to run.
        "phases": {"examples": {"enabled": False},
                   "coverage": {"enabled": True, "extra-data-sources": {"responses": False}},
                   "fuzzing": {"enabled": True, "extra-data-sources": {"responses": False}},
                   "stateful": {"enabled": False}},
        "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
        "operations": [{"include-path-regex": "/stream$", "request-timeout": STREAM_READ_S},
                       {"include-path-regex": "^/staff/reviews/stream$",
                        "generation": {**GENERATION, "max-examples": QUEUE_STREAM_EXAMPLES}}],
    })


def targets(case: Case, location: ParameterLocation, name: str | None = None) -> bool:
    """Whether ``case`` was generated to test that parameter (so it must be left as it is)."""
    data = case.meta.phase.data if case.meta is not None else None
    where = getattr(data, "parameter_location", None)
    aimed = (getattr(data, "parameter", None) or "").lower()
    return where == location and (name is None or aimed == name.lower())


def role_for(case: Case) -> Role:
    """Mostly a role the operation's row lets in (the owner's, a participant, for the owner's
    resources); one case in four any role (a pure function of the case, so Hypothesis replays
    a case with the same token)."""
    row = ROUTES.get((case.method.upper(), case.operation.path))
    if row is not None and row.scope == "owner":
        entitled: list[Role] = ["participant"]
    else:
        entitled = [r for r in ROLES if row is not None and row.capability is not None
                    and row.capability in resolve_capabilities(r)] or list(ROLES)
    h = fingerprint(case)
    return entitled[(h // 4) % len(entitled)] if h % 4 else ROLES[(h // 4) % len(ROLES)]


def fingerprint(case: Case) -> int:
    """A number from what the case was generated with (before ``with_world``), so the same
    case always gets the same token and file, run after run."""
    headers = sorted((k.lower(), str(v)) for k, v in (case.headers or {}).items()
                     if k.lower() != "authorization")
    return zlib.crc32(repr((case.path_parameters, case.query, case.body, headers)).encode())


FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "host", "connection"})
"""Headers of the HTTP message itself, which the client sets: no operation declares them, but
Schemathesis' coverage phase sometimes adds one with a random value (``content-length: Z!3?``),
and a request framed that way is not valid HTTP — the server's parser answers 400 before any
route (h11 and httptools alike), which is no operation's documented answer."""


def with_world(case: Case, res: Resources) -> Case:
    """The case with the world's ids in its path (unless aimed at the path), the world's
    tenant in ``X-Tenant-ID`` (unless aimed at it: a random tenant is only ever a 403), no
    ``FRAMING_HEADERS``, and in half the uploads not aimed at the body a real CSV (random bytes
    are only ever a 422)."""
    key = (case.method.upper(), case.operation.path)
    if (key in ROUTES and ROUTES[key].upload and isinstance(case.body, dict)
            and not targets(case, ParameterLocation.BODY) and (fingerprint(case) >> 8) % 2):
        case.body = {**case.body, "file": CSV}
    at = OWN_RESOURCE.get(key) or (ROUTES[key].at if key in ROUTES else {})
    ids = {name: getattr(res, attr) for name, attr in at.items()}
    params = case.path_parameters or {}
    if at and not targets(case, ParameterLocation.PATH):
        case.path_parameters = {**params, **ids}
    elif key in OWN_RESOURCE:
        # Aimed at the path, it must still never destroy a world id the other operations need.
        shared = set(vars(res).values())
        case.path_parameters = {name: ids.get(name, value) if value in shared else value
                                for name, value in params.items()}
    headers = case.headers or {}
    for name in [h for h in headers if h.lower() in FRAMING_HEADERS]:
        del headers[name]
    for name in [h for h in headers if h.lower() == "x-tenant-id"]:
        if not targets(case, ParameterLocation.HEADER, name):
            headers[name] = TENANT
    return case


def edge_schema(stack: Stack, res: Resources) -> BaseSchema:
    """The edge's OpenAPI as Schemathesis loads it, with the world's ids and tokens hooked in."""
    tokens = role_tokens(stack.settings)
    loaded = schemathesis.openapi.from_url(f"{stack.url}/openapi.json",
                                           config=fuzz_config(stack.url))

    @loaded.hook
    def map_case(_context: Any, case: Case) -> Case:
        return with_world(case, res)

    @loaded.auth()
    class RoleTokens:
        def get(self, _case: Case, _ctx: Any) -> dict[Role, str]:
            return tokens

        def set(self, case: Case, data: dict[Role, str], _ctx: Any) -> None:
            case.headers = {**(case.headers or {}),
                            "Authorization": f"Bearer {data[role_for(case)]}"}

    return loaded


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Run:
    """What the engine found, by operation label (``GET /me/inbox``)."""

    failures: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    seen: set[tuple[str, str]] = field(default_factory=set)
    """(operation, check: title (status)) already reported: one reproduction of each."""
    tested: set[str] = field(default_factory=set)
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    """The statuses each operation answered, over all its cases."""
    errors: list[str] = field(default_factory=list)
    """Errors not tied to one operation (the schema, the run itself)."""
    stop_reason: StopReason | None = None
    seconds: float = 0.0


def caller_of(case: Case) -> str:
    """Whose token the case sent (the reproducing curl masks it): ``role sub@tenant``."""
    auth = next((v for k, v in (case.headers or {}).items() if k.lower() == "authorization"), "")
    if not auth:
        return "no token"
    if not isinstance(auth, str) or not auth.startswith("Bearer "):
        return f"Authorization: {auth!r}"
    try:
        claims = jwt.decode(auth.removeprefix("Bearer "), options={"verify_signature": False})
    except jwt.PyJWTError:
        return "a malformed token"
    return f"{claims.get('role')} {claims.get('sub')}@{claims.get('tenant')}"


def record(run: Run, event: events.ScenarioFinished) -> None:
    """The operation's failures, one reproduction of each kind (check, title, status)."""
    recorder = event.recorder
    run.tested.add(recorder.label)
    for case_id in recorder.cases:
        response = recorder.find_response(case_id=case_id)
        if response is not None:
            run.statuses[recorder.label][response.status_code] += 1
    for case_id, nodes in recorder.checks.items():
        for node in nodes:
            info = node.failure_info
            if info is None:
                continue
            response = recorder.find_response(case_id=case_id)
            status = response.status_code if response is not None else None
            title = getattr(info.failure, "title", None) or type(info.failure).__name__
            headline = f"{node.name}: {title} (status {status})"
            if (recorder.label, headline) in run.seen:
                continue
            run.seen.add((recorder.label, headline))
            message = (getattr(info.failure, "message", "") or "").strip().replace("\n", "; ")
            curl = info.steps[-1].curl if info.steps else info.code_sample
            node_case = recorder.cases.get(case_id)
            who = caller_of(node_case.value) if node_case is not None else "?"
            run.failures[recorder.label].append(
                f"{headline}: {message[:600]}\n    as {who}: " + curl.replace("\n", "\n    "))


def run_engine(schema: BaseSchema) -> Run:
    run = Run()
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            record(run, event)
        elif isinstance(event, events.NonFatalError):
            where = event.label if event.related_to_operation else None
            text = f"{event.info.title}: {event.info.message[:600]}"
            (run.failures[where] if where else run.errors).append(text)
        elif isinstance(event, events.FatalError):
            run.errors.append(f"fatal: {type(event.exception).__name__}: {event.exception}")
        elif isinstance(event, events.EngineFinished):
            run.stop_reason, run.seconds = event.stop_reason, event.running_time
    return run


# --- fixtures and tests -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, simulator_url: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:
    # Quotas high enough that the fuzzer's bursts still reach every route's success (the
    # 429s themselves are tested in tests/unit/test_quotas.py and declared in the OpenAPI).
    quotas = {f"VOICE_QUOTA_{q}": "1000000" for q in (
        "MESSAGES_PER_MINUTE", "CONVERSATIONS_PER_DAY", "UPLOADS_PER_DAY", "STREAMS")}
    with running_stack(kafka_bootstrap, tmp_path_factory.mktemp("fuzz"), simulator_url,
                       **quotas) as s:
        yield s


@pytest.fixture(scope="module")
def fuzz_run(stack: Stack) -> Run:
    res = asyncio.run(build_resources(stack))
    return run_engine(edge_schema(stack, res))


OPERATIONS = sorted(served()[0])


def unresolvable_refs(doc: Any, root: Any = None, where: str = "#") -> Iterator[str]:
    """``where → $ref`` for every ``$ref`` of ``doc`` that does not point into ``root``."""
    root = doc if root is None else root
    if isinstance(doc, dict):
        ref = doc.get("$ref")
        if isinstance(ref, str):
            target: Any = root
            parts = ref.removeprefix("#/").split("/") if ref.startswith("#/") else [""]
            for part in parts:  # a JSON pointer (RFC 6901)
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, dict) and part else None
            if target is None:
                yield f"{where} → {ref}"
        for key, value in doc.items():
            escaped = str(key).replace("~", "~0").replace("/", "~1")
            yield from unresolvable_refs(value, root, f"{where}/{escaped}")
    elif isinstance(doc, list):
        for n, value in enumerate(doc):
            yield from unresolvable_refs(value, root, f"{where}/{n}")


def test_the_openapi_resolves_every_ref() -> None:
    """Every ``$ref`` of the edge's OpenAPI resolves (a client generator fails on one that does
    not; Schemathesis skips the parts it cannot resolve, so the fuzzing alone would not tell)."""
    doc = create_app(VoiceSettings(env="test", state_dir=Path("/nonexistent"))).openapi()
    broken = sorted(set(unresolvable_refs(doc)))
    assert not broken, "unresolvable references:\n  " + "\n  ".join(broken)


def test_the_run_completed(fuzz_run: Run) -> None:
    """Every operation was tested, without a run-wide error."""
    assert fuzz_run.stop_reason == StopReason.COMPLETED, (fuzz_run.stop_reason, fuzz_run.seconds)
    assert not fuzz_run.errors, "\n".join(fuzz_run.errors)
    untested = sorted(f"{m} {p}" for m, p in OPERATIONS if f"{m} {p}" not in fuzz_run.tested)
    assert not untested, f"operations the run never tested: {untested}"


def test_every_operation_reached_its_code(fuzz_run: Run) -> None:
    """The world's ids and tokens got every operation past its checks at least once (a 2xx),
    so no operation was fuzzed only as a 401, 403 or 404."""
    never = {op: dict(counts) for op, counts in fuzz_run.statuses.items()
             if not any(200 <= status < 300 for status in counts)}
    assert not never, f"operations that never answered 2xx (statuses seen): {never}"


@pytest.mark.parametrize("operation", [f"{m} {p}" for m, p in OPERATIONS])
def test_openapi_fuzz(operation: str, fuzz_run: Run) -> None:
    """No 5xx, no undeclared status, no body off its schema, for this operation."""
    found = sorted(fuzz_run.failures.get(operation, []))
    assert not found, f"{operation}:\n  " + "\n  ".join(found)
