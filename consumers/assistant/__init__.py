"""The assistant chat on the worker: datasets, the SQL sandbox, the assistant agent and its
tools, the conversation sequencer, and the turn and extraction workflows (on the engine).

Public names: ``Assistant`` (``Assistant(worker, settings).register()``), ``AssistantSettings``,
``assistant_settings``. ``Assistant`` is imported on first use, so the edge can read the
settings without importing the worker (Faust).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from consumers.assistant.settings import AssistantSettings, assistant_settings

if TYPE_CHECKING:
    from consumers.assistant.worker import Assistant

__all__ = ["Assistant", "AssistantSettings", "assistant_settings"]


def __getattr__(name: str) -> Any:
    if name == "Assistant":
        from consumers.assistant.worker import Assistant

        return Assistant
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
