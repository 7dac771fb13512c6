"""The assistant chat on the worker: datasets, the SQL sandbox, the assistant agent and its
tools, the conversation sequencer, and the turn and extraction workflows (on the engine).

Public names: ``Assistant`` (``Assistant().register(ctx)``). Its settings live in
``streams.assistant_settings``, which the edge reads too.
"""

from consumers.assistant.worker import Assistant

__all__ = ["Assistant"]
