"""The conversation product: participants talk to the concern-extraction agent.

Pure parts: ``sequencer`` (the conversation aggregate's ``decide``), ``concern`` (the agent's
spec and reply parsing). On the worker: ``turns`` (transcripts and the ``conversation-turn``
workflow) and ``product`` (``Conversations().register(ctx)``).

Public names: ``Conversations``, ``ConversationSequencer``, ``ConversationState``.
"""

from consumers.conversations.product import Conversations
from consumers.conversations.sequencer import ConversationSequencer, ConversationState

__all__ = ["ConversationSequencer", "ConversationState", "Conversations"]
