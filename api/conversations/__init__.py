"""The participant's conversations: their views of the log, routes, bodies and rendering.

Public names: ``router`` (every ``/me/conversations`` route, the stream included),
``ConversationViews`` (what the edge's tail feeds).
"""

from api.conversations.routes import router
from api.conversations.views import ConversationViews

__all__ = ["ConversationViews", "router"]
