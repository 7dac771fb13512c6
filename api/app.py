"""The edge's FastAPI app, built in a factory (``create_app``); producer and tail start in the
lifespan, and every product's views are fed by the one tail.

Around the routes, outermost first: ``TraceRequests`` (the request's span, continuing its W3C
``traceparent``: ``api.frame.tracing``), ``EdgeErrors`` (request ids, the catch-all 500,
``Retry-After`` on every 503), gzip for responses of at least ``GZIP_MIN_BYTES`` (never for
``text/event-stream``: Starlette's ``GZipMiddleware`` passes those through untouched and
unbuffered), ``BodyGuard`` (the body read within its limit before anything else runs), and
``RequestDeadline`` (every wait of a request within the gateway bound, ``api.frame.deadline``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from pydantic import BaseModel
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware

from api import assistant, conversations, staff
from api.assistant import AssistantViews
from api.assistant.upload import UPLOAD_PATH, upload_body_limit
from api.assistant.views import display_seq_of
from api.conversations import ConversationViews
from api.conversations.owners import OwnerIndex
from api.frame.activity import LastRequest, NoteRequests
from api.frame.body import BodyGuard, BodyLimit
from api.frame.cold import (
    ColdLog,
    conversation_gap_reader,
    conversation_reader,
    gap_reader,
    key_reader,
)
from api.frame.commands import edge_producer
from api.frame.deadline import RequestDeadline
from api.frame.deps import InspectDep
from api.frame.errors import EDGE_ERRORS, EdgeErrors, install_error_handlers
from api.frame.lane import StreamLane
from api.frame.models import CursorTooOldOut
from api.frame.on_demand import ReadOnDemand
from api.frame.projection import CursorTooOld
from api.frame.tail import EdgeTail
from api.frame.tracing import TraceRequests
from api.staff import StaffViews
from api.web import install_web
from streams.assistant_settings import assistant_settings
from streams.envelope import Envelope
from streams.heap import collect_when_idle
from streams.ids import conversation_since_ms, workflow_since_ms
from streams.sealing import sealer_for
from streams.settings import VoiceSettings, load_settings
from streams.topics import ASSISTANT, DELTAS, OWNERS, WORKFLOWS, missing_topics, topic_name

GZIP_MIN_BYTES = 1024
"""Responses at least this large are gzipped for a client that accepts it (seed 000 §2)."""


NO_FASTAPI_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False,
                                          "operation_spans": False}
"""FastAPI's own OpenTelemetry, off: ``TraceRequests`` is the edge's one request span (never a
query, a header's value or a body). FastAPI's turns itself on once the process has a tracer
provider (every Voice process has one, ``streams.tracing.configure``) and would add a second
server span per request, spans of dependency resolution and serialisation, and exception
messages in logs — and wrap every message a stream sends (docs/benchmarks.md, "Streams per
edge … second pass")."""


class Health(BaseModel):
    status: str


class HeldConversations(BaseModel):
    """What this edge holds of the conversation log (decision 0011)."""

    in_memory: int
    """Conversations whose view is in memory: with a history window, those asked for or
    started inside it."""
    held: int
    """Conversations whose records are held while their read from the log runs."""


class HeldWorkflows(BaseModel):
    """What this edge holds of ``voice.workflows``."""

    in_memory: int
    """Workflows whose view is in memory."""
    turns_let_go: int
    """Ended workflows of turns let go of past ``VOICE_EDGE_TURN_WORKFLOWS_KEPT``, since start."""
    left_before_window: int
    """With a history window: records of turns' workflows older than it, left unread at start."""


class EdgeState(BaseModel):
    """An edge process's own state, for its operators: deployment-wide counts, no ids."""

    conversations: HeldConversations
    assistant: HeldConversations
    """What it holds of the assistant's conversation log (``voice.assistant``), the same way."""
    workflows: HeldWorkflows
    owners: HeldConversations | None = None
    """With a history window: the owners whose entries of the index by owner it holds (read
    for their list), and those being read (decision 0015)."""
    skipped: dict[str, dict[str, int]]
    """Per topic, the records the tail skipped by reason (undecodable, or a view raised on
    them): not a reason to be unready — the writer side dead-letters them — but worth seeing."""


def on_record(views: ConversationViews) -> Callable[[Envelope], None]:
    """What the edge does with each conversation record: update its views. (Its data key is
    dropped by the key service when the tombstone arrives, not here: docs/keys.md.)"""
    return views.apply


async def evict_unused(projections: tuple[ReadOnDemand[Any], ...], window_s: float) -> None:
    """Drop the conversation views (and owners' index entries) unused for the history window,
    now and then, so an edge holds the conversations in use, not every one it was asked for
    (decision 0011, step 4)."""
    while True:
        await asyncio.sleep(max(1.0, window_s / 4))
        for views in projections:
            views.evict_idle(window_s)


def create_app(settings: VoiceSettings | None = None, bind_host: str | None = None,
               idle_collections: bool = False) -> FastAPI:
    """Build the edge app for ``settings`` (read from the environment when omitted), to listen
    on ``bind_host`` (it decides whether the dev sign-in route exists; None: unknown, it does
    not). ``idle_collections``: the process's full garbage collections run while the edge is
    idle, no request coming in and no record applied (``streams.heap.collect_when_idle``); for
    an edge process whose heap is settled (``voice edge``), not an app among others in one
    process (a test's)."""
    settings = settings or load_settings()
    chat_settings = assistant_settings(settings)
    last_request = LastRequest()  # NoteRequests sets it; the idle collections read it

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The cold reader needs the tail (where it started), made below; it reads it late.
        cold = ColdLog(settings)
        views = ConversationViews(kept=settings.edge_events_kept, cold=(
            None if settings.edge_history_s is None
            else lambda key: conversation_reader(cold, app.state.tail)(key)),
            gap=lambda key, after, upto, since_ms=None: conversation_gap_reader(
                cold, app.state.tail)(key, after, upto, since_ms))
        # The index by owner lists what a windowed edge does not hold (decision 0015).
        owners_topic = topic_name(settings, OWNERS)
        owners = (None if settings.edge_history_s is None else OwnerIndex(
            cold=lambda key: key_reader(cold, app.state.tail, owners_topic,
                                        lambda _key: None)(key)))
        sealer = await asyncio.to_thread(sealer_for, settings)
        app.state.settings = settings
        app.state.views = views
        app.state.owners = owners
        app.state.sealer = sealer
        app.state.producer = edge_producer(settings)
        app.state.staff = StaffViews(
            kept=settings.edge_events_kept,
            turn_workflows_kept=settings.edge_turn_workflows_kept,
            cold_workflow=lambda key: key_reader(cold, app.state.tail,
                                                 topic_name(settings, WORKFLOWS),
                                                 workflow_since_ms)(key))
        chats = topic_name(settings, ASSISTANT)
        app.state.assistant = AssistantViews(chat_settings, cold=(
            None if settings.edge_history_s is None
            else lambda key: key_reader(cold, app.state.tail, chats,
                                        conversation_since_ms)(key)),
            gap=lambda key, after, upto, since_ms=None: gap_reader(
                cold, app.state.tail, chats, display_seq_of)(key, after, upto, since_ms))
        app.state.tail = EdgeTail(settings, on_conversation=on_record(views),
                                  more=app.state.staff.handlers(),
                                  located={**app.state.assistant.tail_handlers(),
                                           **app.state.staff.located_handlers()},
                                  live={DELTAS: views.apply_delta,
                                        **({} if owners is None else {OWNERS: owners.on_tail})},
                                  before_window=app.state.staff.before_window(),
                                  windowed=(ASSISTANT,),
                                  # What no turn of a conversation writes to: its own fetches.
                                  apart=(*app.state.staff.quiet_topics(),
                                         *app.state.assistant.tail_handlers()))
        app.state.tail.start()
        evicting = (None if settings.edge_history_s is None else
                    asyncio.create_task(evict_unused(
                        (views, app.state.assistant.conversations,
                         *(() if owners is None else (owners,))), settings.edge_history_s)))
        collecting = (asyncio.create_task(collect_when_idle(
            lambda: max(app.state.tail.applied_at, last_request.at)))
            if idle_collections else None)
        try:
            yield
        finally:
            for task in (evicting, collecting):
                if task is not None:
                    task.cancel()
            app.state.tail.stop()
            await asyncio.to_thread(cold.close)
            app.state.producer.close()
            await asyncio.to_thread(sealer.close)

    app = FastAPI(title="Voice edge", version="0.1.0", lifespan=lifespan,
                  telemetry=NO_FASTAPI_TELEMETRY)
    for router in (conversations.router, staff.router, assistant.router):
        app.include_router(router, responses=EDGE_ERRORS)
    install_web(app, settings, bind_host)
    install_error_handlers(app)
    # add_middleware wraps what was added before: the last one added is the outermost.
    app.add_middleware(RequestDeadline, bound_s=settings.gateway_bound_s)
    app.add_middleware(BodyGuard,
                       default=BodyLimit(settings.max_body_bytes, "VOICE_MAX_BODY_BYTES"),
                       by_path={UPLOAD_PATH: upload_body_limit(chat_settings)})
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=6,
                       exclude_content_types=DEFAULT_EXCLUDED_CONTENT_TYPES)
    # Held streams go no further: not gzipped, no body to read, no deadline (api.frame.lane).
    app.add_middleware(StreamLane, routes=[conversations.STREAM_LANE])
    app.add_middleware(EdgeErrors)
    app.add_middleware(TraceRequests)  # the request's span covers all of it
    app.add_middleware(NoteRequests, last=last_request)  # outermost: every request, first
    app.state.last_request = last_request

    @app.exception_handler(CursorTooOld)
    async def cursor_too_old(_request: Request, exc: CursorTooOld) -> JSONResponse:
        body = CursorTooOldOut(detail=str(exc), oldest_cursor=exc.oldest)
        return JSONResponse(body.model_dump(), status_code=409)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> Health:
        """The process is up."""
        return Health(status="ok")

    @app.get("/readyz", tags=["ops"], responses={503: {"description": "not ready"}})
    async def readyz() -> JSONResponse:
        """Broker reachable, topics present, the edge's consumers assigned and caught up: ready
        or not, and why — nothing more, since anyone may ask (``/ops/edge`` has the counts)."""
        checks: dict[str, object] = {}
        try:
            missing = await asyncio.to_thread(missing_topics, app.state.settings, 3.0)
            checks["broker"] = "ok"
            checks["topics"] = "ok" if not missing else {"missing": missing}
        except Exception as exc:
            checks["broker"] = f"unreachable: {exc}"
            checks["topics"] = "unknown"
        tail: EdgeTail = app.state.tail
        checks["consumers"] = "assigned" if tail.assigned.is_set() else "not assigned"
        checks["caught_up"] = tail.caught_up.is_set()
        keys = getattr(app.state.sealer.store, "ready", None)
        checks["keys"] = "ready" if keys is None or keys.is_set() else "reading"
        ready = (checks["broker"] == "ok" and checks["topics"] == "ok"
                 and tail.assigned.is_set() and tail.caught_up.is_set()
                 and checks["keys"] == "ready")
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    @app.get("/ops/edge", tags=["ops"], responses=EDGE_ERRORS)
    async def edge_state(_operator: InspectDep) -> EdgeState:
        """This edge's own state: the conversations (participants' and the assistant's) and
        workflows it holds, the records its tail skipped."""
        views: ConversationViews = app.state.views
        tail: EdgeTail = app.state.tail
        workflows = app.state.staff.workflows
        chats = app.state.assistant.conversations
        owners: OwnerIndex | None = app.state.owners
        return EdgeState(conversations=HeldConversations(in_memory=len(views),
                                                         held=len(views.pending)),
                         assistant=HeldConversations(in_memory=len(chats),
                                                     held=len(chats.pending)),
                         workflows=HeldWorkflows(in_memory=len(workflows),
                                                 turns_let_go=workflows.turns_let_go,
                                                 left_before_window=tail.left_before_window),
                         owners=None if owners is None else HeldConversations(
                             in_memory=len(owners), held=len(owners.pending)),
                         skipped=tail.skipped_counts())

    return app
