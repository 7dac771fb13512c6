"""The assistant agent: its prompt and spec, the user content of a request, the opened history,
and the ``[CURRENT_STATE]`` it sees (active datasets, focus, selection, suggested context).

Pure: the request and transcript come in already opened; nothing here does I/O.
"""

from __future__ import annotations

import json
from typing import Any

from consumers.assistant.images import REF_SOURCE
from consumers.assistant.patterns import Suggestion
from consumers.engine import AgentSpec, StateView, ToolRegistry
from streams.assistant_settings import AssistantSettings

AGENT_NAME = "assistant"
IDENTITY = (
    f"[agent: {AGENT_NAME}]\n"
    "You are Voice's data assistant. People attach CSV datasets and ask questions about them. "
    "Look at a dataset with `describe_dataset` before querying it; query it with "
    "`query_dataset` (ClickHouse SQL over the table `data`, read-only); put rows with "
    "coordinates on a map with `display_map`. Answer briefly, say what you did and what the "
    "numbers are, and never invent values that a tool did not return."
)
TOOL_GUIDANCE = (
    "Datasets are named by their id, the hex after 'ID:' in the message or in [CURRENT_STATE]. "
    "Only the datasets attached to the conversation can be read. In SQL the table is always "
    "`data`; a hint with alternatives means a name was wrong: use one of them."
)


def assistant_spec(settings: AssistantSettings, tools: ToolRegistry) -> AgentSpec:
    """The agent, with one turn's tools (they close over that turn's datasets)."""
    return AgentSpec(name=AGENT_NAME, identity=IDENTITY, tools=tools,
                     model=settings.assistant_model or settings.model,
                     fallback_models=tuple(settings.fallback_models),
                     compaction_model=settings.compaction_model, max_output_tokens=4096,
                     history_token_budget=settings.history_token_budget,
                     tool_guidance=TOOL_GUIDANCE, allowed_models=settings.allowed_models)


def dataset_line(d: dict[str, Any]) -> str:
    """``[Dataset: name | rows × cols | ID: …]``, the reference a model (and the simulator)
    finds a dataset by."""
    return (f"[Dataset: {d.get('name', 'dataset')} | {d.get('rows', '?')} rows × "
            f"{len(d.get('columns') or [])} columns | ID: {d['dataset_id']}]")


def user_content(request: dict[str, Any]) -> str:
    """The user's message as the model sees it: the text, then what is attached."""
    parts = [str(request.get("message", "")).strip()]
    datasets = request.get("datasets") or []
    if datasets:
        parts.append("Attached datasets:\n" + "\n".join(dataset_line(d) for d in datasets))
    files = [str(f) for f in request.get("file_context") or [] if str(f).strip()]
    if files:
        parts.append("Attached files:\n" + "\n".join(f"- {f}" for f in files))
    return "\n\n".join(parts)


def user_message(request: dict[str, Any]) -> str | list[dict[str, Any]]:
    """The user's message as the model gets it: ``user_content`` text, preceded by one image
    reference block per attached image (``consumers.assistant.images`` resolves them)."""
    text = user_content(request)
    images = [i for i in request.get("images") or [] if isinstance(i, dict)]
    if not images:
        return text
    return [*({"type": "image", "source": {"type": REF_SOURCE, **i}} for i in images),
            {"type": "text", "text": text}]


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [dict(b) for b in content or [] if isinstance(b, dict)]


def history_messages(turns: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Messages-API history from opened transcript entries: ``("user", request)`` and
    ``("assistant", chain)``. Roles alternate (same-role neighbours are merged) and it starts
    with the user; each reply contributes its whole tool-call chain."""
    return history_with_seqs([(role, payload, 0) for role, payload in turns])[0]


def history_with_seqs(turns: list[tuple[str, Any, int]]
                      ) -> tuple[list[dict[str, Any]], list[int]]:
    """``history_messages`` of ``(role, payload, seq)`` entries, and the last log seq each
    message holds (where a summary that ends before a message covers through)."""
    messages: list[dict[str, Any]] = []
    seqs: list[int] = []
    for role, payload, seq in turns:
        if role == "user":
            items = [{"role": "user", "content": user_message(payload)}]
        elif not messages:
            continue  # a reply without its request (trimmed away): its chain would dangle
        else:
            items = [m for m in payload.get("structured_content") or []
                     if isinstance(m, dict) and m.get("role") in ("user", "assistant")]
            if not items and payload.get("text"):
                items = [{"role": "assistant", "content": payload["text"]}]
        for item in items:
            if messages and messages[-1]["role"] == item["role"]:
                messages[-1] = {"role": item["role"],
                                "content": _blocks(messages[-1]["content"])
                                + _blocks(item["content"])}
                seqs[-1] = seq
            else:
                messages.append({"role": item["role"], "content": item["content"]})
                seqs.append(seq)
    return messages, seqs


def state_text(request: dict[str, Any], options: dict[str, Any],
               suggestions: list[Suggestion],
               view: StateView | None = None) -> str:
    """The assistant's part of ``[CURRENT_STATE]`` (the engine adds step, datasets, tools)."""
    lines: list[str] = []
    datasets = request.get("datasets") or []
    if datasets:
        lines.append("[ACTIVE DATASETS] (query each as the table `data`)")
        for d in datasets:
            lines.append(f"- {dataset_line(d)} columns: {', '.join(d.get('columns') or [])}")
    else:
        lines.append("[ACTIVE DATASETS] none attached")
    if request.get("focus_context"):
        lines.append("[FOCUS] " + json.dumps(request["focus_context"], sort_keys=True)[:2000])
    if request.get("selection_state"):
        lines.append("[SELECTION] " + json.dumps(request["selection_state"],
                                                 sort_keys=True)[:2000])
    if options.get("agentic_mode"):
        lines.append("[MODE] agentic: first call `plan` with short steps, then carry them out "
                     "one by one, calling `plan` again to mark each finished step done")
    if options.get("namespace_id"):
        lines.append(f"[NAMESPACE] {options['namespace_id']}")
    if suggestions:
        lines.append("[SUGGESTED CONTEXT] (patterns learned in earlier turns of this tenant, "
                     "ranked by BM25 against this message; why each was chosen in brackets)")
        lines += [f"- ({s.why()}) {s.pattern.text}" for s in suggestions]
    if view is not None and view.tools_called:
        lines.append(f"[PROGRESS] {len(view.tools_called)} tool call(s) so far this turn")
    return "\n".join(lines)
