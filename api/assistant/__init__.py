"""The assistant chat product: its views of ``voice.assistant`` and ``voice.datasets``, the
upload, chat, stream, turn and erasure routes, and their bodies.

Public names: ``router`` (every ``/api/v1/assistant`` route), ``AssistantViews`` (what the
edge's tail feeds).
"""

from fastapi import APIRouter

from api.assistant import erasure, routes, upload
from api.assistant.views import AssistantViews

router = APIRouter()
router.include_router(upload.router)
router.include_router(routes.router)
router.include_router(erasure.router)

__all__ = ["AssistantViews", "router"]
