"""History budget, summaries, and the context-window guard.

Token counts are estimated at about four characters a token and calibrated by the ratio between
the previous call's real ``input_tokens`` and its estimate. Over the history budget, the older
part of the canonical history is replaced by a summary made by the compaction model (agent
``compaction``, through the same ``ModelCaller``, so its cost is recorded); the most recent
messages stay raw, and the summary says which prefix it covers (``summary_through``).

Inside the loop, at 80 % of the usable context the largest old tool results are replaced by a
short note that keeps their ``tool_use_id``; at 95 % the loop stops (``context_limit``).
Nothing here changes the canonical history a caller passed in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from consumers.engine.model import ModelCaller
from consumers.engine.types import AgentSpec, HistorySummary

CHARS_PER_TOKEN = 4
COMPACT_AT = 0.80
STOP_AT = 0.95
COMPACT_TARGET = 0.60
COMPACTED = "[compacted:"
COMPACTION_IDENTITY = ("[agent: compaction]\nYou summarise conversations faithfully: every "
                       "concern, decision, number, dataset and open question, in order. Write "
                       "only the summary.")


IMAGE_TOKENS = 1600
"""What one ``image`` block is counted as: the Messages API scales a larger image down to about
1.15 megapixels, about 1,600 tokens. Its base64 text says nothing of its cost."""


def _without_images(obj: Any, found: list[int]) -> Any:
    if isinstance(obj, dict):
        if obj.get("type") == "image":
            found[0] += 1
            return {"type": "image"}
        return {k: _without_images(v, found) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_without_images(v, found) for v in obj]
    return obj


def estimate_tokens(obj: Any) -> int:
    """About one token per four characters of the JSON (or text) of ``obj``; ``IMAGE_TOKENS``
    per image block."""
    if isinstance(obj, str):
        return (len(obj) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    found = [0]
    text = json.dumps(_without_images(obj, found), ensure_ascii=False, default=str)
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN + found[0] * IMAGE_TOKENS


class Calibration:
    """Learns how far the estimate is off from the real ``input_tokens`` of the last call."""

    def __init__(self) -> None:
        self.ratio = 1.0

    def observe(self, estimated: int, real: int) -> None:
        if estimated > 0 and real > 0:
            self.ratio = min(4.0, max(0.25, real / estimated))

    def apply(self, estimated: int) -> int:
        return int(estimated * self.ratio)


@dataclass(frozen=True)
class ContextGuard:
    """Where the request stands against ``context_window - max_output_tokens``."""

    context_window: int
    max_output_tokens: int

    @property
    def limit(self) -> int:
        return max(1, self.context_window - self.max_output_tokens)

    def assess(self, tokens: int) -> Literal["ok", "compact", "stop"]:
        if tokens >= STOP_AT * self.limit:
            return "stop"
        return "compact" if tokens >= COMPACT_AT * self.limit else "ok"


# ------------------------------------------------------------------------- history budget
@dataclass(frozen=True)
class PreparedHistory:
    messages: list[dict[str, Any]]
    summary: HistorySummary | None
    summarised: bool = False
    """True when a new summary was made this turn."""


def _is_user_text(msg: dict[str, Any]) -> bool:
    if msg.get("role") != "user":
        return False
    content = msg.get("content")
    if isinstance(content, str):
        return True
    blocks = [b for b in content or [] if isinstance(b, dict)]
    return (any(b.get("type") == "text" for b in blocks)
            and not any(b.get("type") == "tool_result" for b in blocks))


def choose_cut(history: Sequence[dict[str, Any]], keep: int) -> int:
    """Index where the raw part starts: a user text message at most ``keep`` from the end
    (so no tool_result is separated from its tool_use). 0 means nothing can be summarised."""
    starts = [i for i in range(1, len(history)) if _is_user_text(history[i])]
    recent = [i for i in starts if i >= len(history) - keep]
    older = [i for i in starts if i < len(history) - keep]
    return recent[0] if recent else older[-1] if older else 0


def transcript(messages: Sequence[dict[str, Any]]) -> str:
    """The full text of messages for the compaction model (nothing truncated)."""
    lines = []
    for i, msg in enumerate(messages):
        content = msg.get("content")
        if isinstance(content, str):
            lines.append(f"[{i}] {msg.get('role')}: {content}")
            continue
        for b in content or []:
            kind = b.get("type")
            if kind == "text":
                lines.append(f"[{i}] {msg.get('role')}: {b.get('text', '')}")
            elif kind == "tool_use":
                lines.append(f"[{i}] tool call {b.get('name')} ({b.get('id')}): "
                             f"{json.dumps(b.get('input'), ensure_ascii=False, default=str)}")
            elif kind == "tool_result":
                body = b.get("content")
                text = body if isinstance(body, str) else json.dumps(body, default=str)
                lines.append(f"[{i}] tool result ({b.get('tool_use_id')}): {text}")
    return "\n".join(lines)


def with_summary(summary: HistorySummary, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary as the first text block of the first raw (user) message."""
    note = {"type": "text", "text": f"[CONVERSATION SUMMARY of messages 0-"
                                    f"{summary.summary_through - 1}]\n{summary.text}"}
    first = dict(raw[0])
    content = first.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    first["content"] = [note, *blocks]
    return [first, *raw[1:]]


async def prepare_history(spec: AgentSpec, history: list[dict[str, Any]],
                          stored: HistorySummary | None, caller: ModelCaller) -> PreparedHistory:
    """History within budget: as is, or a (reused or new) summary + the recent messages."""
    if estimate_tokens(history) <= spec.history_token_budget:
        return PreparedHistory(list(history), None)
    cut = choose_cut(history, spec.history_recent_keep)
    if cut <= 0:
        return PreparedHistory(list(history), None)
    if stored is not None and stored.summary_through == cut:
        return PreparedHistory(with_summary(stored, history[cut:]), stored)
    model = spec.compaction_model or spec.model
    response = await caller.call(
        agent_name="compaction", iteration=1, chain=[model, *spec.fallback_models],
        system=[{"type": "text", "text": COMPACTION_IDENTITY}],
        messages=[{"role": "user", "content": transcript(history[:cut])}], tools=[],
        max_tokens=spec.max_output_tokens)
    summary = HistorySummary(response.text.strip(), cut)
    return PreparedHistory(with_summary(summary, history[cut:]), summary, summarised=True)


# ------------------------------------------------------------------------- in-loop compaction
def compact_tool_results(messages: list[dict[str, Any]], target_tokens: int,
                         estimate: Any) -> tuple[list[dict[str, Any]], int]:
    """Replace the largest old tool results (not the latest tool_result message) by a note
    keeping the call id, until ``estimate(messages) <= target_tokens``. Returns a new list."""
    latest = max((i for i, m in enumerate(messages)
                  if any(isinstance(b, dict) and b.get("type") == "tool_result"
                         for b in (m.get("content") if isinstance(m.get("content"), list)
                                   else []))), default=-1)
    candidates = []
    for i, msg in enumerate(messages[:latest] if latest >= 0 else []):
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for j, b in enumerate(content):
            if (isinstance(b, dict) and b.get("type") == "tool_result"
                    and not str(b.get("content", "")).startswith(COMPACTED)):
                candidates.append((estimate_tokens(b.get("content")), i, j))
    out = [dict(m) for m in messages]
    done = 0
    for size, i, j in sorted(candidates, reverse=True):
        if estimate(out) <= target_tokens:
            break
        content = list(out[i]["content"])
        old = content[j]
        content[j] = {"type": "tool_result", "tool_use_id": old.get("tool_use_id"),
                      "content": f"{COMPACTED} the result of tool call {old.get('tool_use_id')} "
                                 f"(~{size} tokens) was removed to save context; call the tool "
                                 "again if you need it]",
                      **({"is_error": True} if old.get("is_error") else {})}
        out[i] = {**out[i], "content": content}
        done += 1
    return out, done
