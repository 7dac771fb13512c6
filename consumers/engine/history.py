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

import orjson

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
    """About one token per four characters of the compact JSON (or text) of ``obj``;
    ``IMAGE_TOKENS`` per image block.

    orjson writes the JSON (a 60-turn history in ~20 µs, against ~700 µs for the standard
    library's with the images' copy: docs/benchmarks.md, issue 14, twenty-first pass); only a
    history with an image block, or a value orjson refuses (a key that is not a string, an
    integer past 64 bits, a lone surrogate), takes the copy without images and the standard
    library's encoder, which write the same characters."""
    if isinstance(obj, str):
        return (len(obj) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    try:
        data = orjson.dumps(obj, default=str)
    except (orjson.JSONEncodeError, TypeError):
        data = None
    if data is not None and _IMAGE not in data:
        chars = len(data.decode())
        return (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    found = [0]
    text = json.dumps(_without_images(obj, found), ensure_ascii=False, default=str,
                      separators=(",", ":"))
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN + found[0] * IMAGE_TOKENS


_IMAGE = b'"type":"image"'
"""An image block in orjson's JSON (inside a string the quotes would be escaped)."""


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


def choose_cut(history: Sequence[dict[str, Any]], keep: int, raw_budget: int | None = None,
               start: int = 0) -> int:
    """Index where the raw part starts, after ``start``: a user text message (so no
    tool_result is separated from its tool_use), the earliest that leaves at most ``keep``
    messages and at most ``raw_budget`` tokens raw; when none does, the latest one. 0 means
    nothing can be summarised."""
    starts = [i for i in range(start + 1, len(history)) if _is_user_text(history[i])]
    if not starts:
        return 0
    tail = [0] * (len(history) + 1)  # tokens of history[i:], summed once
    for i in range(len(history) - 1, -1, -1):
        tail[i] = tail[i + 1] + estimate_tokens(history[i])
    fitting = [i for i in starts if len(history) - i <= keep
               and (raw_budget is None or tail[i] <= raw_budget)]
    return fitting[0] if fitting else starts[-1]


def transcript(messages: Sequence[dict[str, Any]], first: int = 0) -> str:
    """The full text of messages for the compaction model (nothing truncated), numbered from
    ``first``."""
    lines = []
    for i, msg in enumerate(messages, start=first):
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


def lead_with(note: str, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``note`` as the start of the first message when it is the user's, else as a user
    message of its own before it. Returns a new list; ``history`` is not changed."""
    if not history or history[0].get("role") != "user":
        return [{"role": "user", "content": note}, *history]
    first = dict(history[0])
    content = first.get("content")
    if isinstance(content, str):
        first["content"] = f"{note}\n\n{content}"
    else:
        first["content"] = [{"type": "text", "text": note}, *(content or [])]
    return [first, *history[1:]]


def with_summary(summary: HistorySummary, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary as the first text block of the first raw (user) message."""
    note = {"type": "text", "text": f"[CONVERSATION SUMMARY of messages 0-"
                                    f"{summary.summary_through - 1}]\n{summary.text}"}
    if not raw or raw[0].get("role") != "user":
        return [{"role": "user", "content": [note]}, *raw]
    first = dict(raw[0])
    content = first.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    first["content"] = [note, *blocks]
    return [first, *raw[1:]]


def lead_with_stored(history: list[dict[str, Any]], seqs: list[int],
                     summary: tuple[int, str] | None, omitted_through: int, setting: str
                     ) -> tuple[list[dict[str, Any]], list[int]]:
    """A product's history as a turn hands it to the engine: its stored summary (``(through
    seq, text)``) leads the first message, and records left out unsummarised (over the
    ``setting`` bound, through seq ``omitted_through``) are said to be, in the same place —
    so nothing is ever dropped silently. ``seqs`` (the last log seq each message holds) gains
    the summary's seq when the note needs a message of its own."""
    notes, through = [], 0
    if summary is not None:
        through = summary[0]
        notes.append(f"[CONVERSATION SUMMARY through seq {through}]\n{summary[1]}")
    if omitted_through > through:
        through = omitted_through
        notes.append(f"[Earlier messages of this conversation, through seq {omitted_through}, "
                     f"are left out: they are over the history a turn reads ({setting}) "
                     "and could not be summarised.]")
    if not notes:
        return history, seqs
    led = lead_with("\n\n".join(notes), history)
    return led, ([through, *seqs] if len(led) > len(history) else list(seqs))


def compaction_input(previous: HistorySummary | None, messages: Sequence[dict[str, Any]],
                     first: int) -> str:
    """What the compaction model reads: the previous summary (if any) and the messages after
    it up to the cut — never the history the previous summary already covers."""
    text = transcript(messages, first)
    if previous is None:
        return text
    return (f"[PREVIOUS SUMMARY of messages 0-{first - 1}]\n{previous.text}\n\n"
            f"[MESSAGES AFTER IT]\n{text}")


def summary_tokens(spec: AgentSpec) -> int:
    """The most a summary may be: half the headroom a new summary leaves (so summary + raw
    part stay at most ``(1 + history_raw_share) / 2`` of the budget), and never more than the
    agent's output limit."""
    headroom = spec.history_token_budget * (1 - spec.history_raw_share)
    return max(256, min(spec.max_output_tokens, int(headroom / 2)))


async def prepare_history(spec: AgentSpec, history: list[dict[str, Any]],
                          stored: HistorySummary | None, caller: ModelCaller) -> PreparedHistory:
    """History within budget: as is, or the (reused or new) summary + the recent messages.

    ``stored`` (a summary of ``history[:stored.summary_through]``) is reused, without a model
    call, as long as it and the messages after it fit ``history_token_budget`` — not only when
    a new cut would land where it did. Over the budget, a new summary is made from the stored
    one and the messages after it up to a new cut (``choose_cut``); the cut leaves at most
    ``history_raw_share`` of the budget raw, so the next summary waits until about
    ``(1 - history_raw_share) × budget`` tokens of new history (less the summary) have come:
    hysteresis, not a summary every turn once a conversation is over budget (the summary is
    itself bounded, ``summary_tokens``). The products
    fold their stored summary into the history they pass (``lead_with``), ``stored=None``,
    and the same rule holds: the folded summary is the first message the new one reads.
    """
    budget = spec.history_token_budget
    if stored is not None and not 0 <= stored.summary_through <= len(history):
        stored = None  # it covers another history: ignore it rather than drop messages
    base = stored.summary_through if stored is not None else 0
    current = list(history) if stored is None else with_summary(stored, history[base:])
    if estimate_tokens(current) <= budget:
        return PreparedHistory(current, stored)
    cut = choose_cut(history, spec.history_recent_keep, int(budget * spec.history_raw_share),
                     start=base)
    if cut <= base:  # nothing more can be summarised without splitting an exchange
        return PreparedHistory(current, stored)
    model = spec.compaction_model or spec.model
    response = await caller.call(
        agent_name="compaction", iteration=1, chain=[model, *spec.fallback_models],
        system=[{"type": "text", "text": COMPACTION_IDENTITY}],
        messages=[{"role": "user", "content": compaction_input(stored, history[base:cut],
                                                               base)}],
        tools=[], max_tokens=summary_tokens(spec))
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
