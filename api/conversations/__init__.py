"""The participant's conversations: their views of the log, routes, bodies and rendering.

Public names: ``router`` (every ``/me/conversations`` route, the stream included),
``STREAM_LANE`` (the stream, served by ``api.frame.lane``), ``ConversationViews`` (what the
edge's tail feeds).
"""

from api.conversations.routes import STREAM_LANE, router
from api.conversations.views import ConversationViews

__all__ = ["STREAM_LANE", "ConversationViews", "router"]
