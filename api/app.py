"""The edge's FastAPI app, built in a factory (``create_app``); producer and tail start in the
lifespan, and every product's views are fed by the one tail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from api import assistant, conversations, staff
from api.assistant import AssistantViews
from api.conversations import ConversationViews
from api.frame.models import CursorTooOldOut
from api.frame.projection import CursorTooOld
from api.frame.tail import EdgeTail
from api.staff import StaffViews
from schemas.conversation import ConversationErased
from streams.assistant_settings import assistant_settings
from streams.envelope import Envelope
from streams.producer import RecordProducer
from streams.sealing import Sealer, sealer_for
from streams.settings import VoiceSettings, load_settings
from streams.topics import missing_topics


class Health(BaseModel):
    status: str


def on_record(views: ConversationViews, sealer: Sealer) -> Callable[[Envelope], None]:
    """What the edge does with each conversation record: update its views and, when a
    conversation was erased (by any edge), forget its cached data key."""

    def handle(env: Envelope) -> None:
        views.apply(env)
        if isinstance(env.record, ConversationErased):
            sealer.purge(env.key)

    return handle


def create_app(settings: VoiceSettings | None = None) -> FastAPI:
    """Build the edge app for ``settings`` (read from the environment when omitted)."""
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        views = ConversationViews(kept=settings.edge_events_kept)
        sealer = sealer_for(settings)
        app.state.settings = settings
        app.state.views = views
        app.state.sealer = sealer
        app.state.producer = RecordProducer(settings)
        app.state.staff = StaffViews(kept=settings.edge_events_kept)
        app.state.assistant = AssistantViews(assistant_settings(settings))
        app.state.tail = EdgeTail(settings, on_conversation=on_record(views, sealer),
                                  more=app.state.staff.handlers(),
                                  located=app.state.assistant.tail_handlers())
        app.state.tail.start()
        try:
            yield
        finally:
            app.state.tail.stop()
            app.state.producer.close()

    app = FastAPI(title="Voice edge", version="0.1.0", lifespan=lifespan)
    app.include_router(conversations.router)
    app.include_router(staff.router)
    app.include_router(assistant.router)

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
        """Broker reachable, topics present, the edge's consumers assigned and caught up."""
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
        ready = (checks["broker"] == "ok" and checks["topics"] == "ok"
                 and tail.assigned.is_set() and tail.caught_up.is_set())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    return app
