"""The concern-extraction agent: reads a participant's conversation and proposes concerns.

Its answer is human-readable text, optionally followed by a fenced ``json`` block holding a
``Proposal``; an answer starting ``COULD_NOT_INTERPRET:`` means it could not interpret the
message. The agent has no memory of its own: the transcript is handed to it per turn.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from consumers.conversations.catalog import IssueCatalog
from consumers.conversations.catalog import (  # the name's older home, kept for callers
    MemoryIssueCatalog as MemoryIssueCatalog,
)
from consumers.engine import (
    AgentSpec,
    CancelToken,
    EffectSink,
    Hint,
    HistorySummary,
    Ok,
    Tool,
    ToolContext,
    ToolRegistry,
    TurnInput,
    run_turn,
)
from schemas.conversation import Proposal
from streams.settings import VoiceSettings

AGENT_NAME = "concern-extraction"
SYSTEM_PROMPT = (
    f"[agent: {AGENT_NAME}]\n"
    "You are Voice's concern-extraction agent. A participant tells you, in their own words, "
    "what worries them about their community. Reply briefly and kindly. Extract each concern "
    "as a short statement with the participant's words it came from. When the participant "
    "asks for something, propose an issue: an existing one found with `search_issues` if one "
    "fits, else a new one with a title and a summary. End your reply with a fenced json block: "
    '{"concerns": [{"statement": str, "quote": str}], "relates_to_issue": str|null, '
    '"new_issue": {"title": str, "summary": str}|null}. If you cannot interpret the message, '
    "answer only `COULD_NOT_INTERPRET: <reason>`."
)

_JSON_BLOCK = re.compile(r"```json\s*(\{.*?\})\s*```", re.S)
CANNOT = "COULD_NOT_INTERPRET:"


@dataclass(frozen=True)
class ConcernReply:
    """The agent's answer, parsed."""

    text: str
    proposal: Proposal | None
    could_not_interpret: str | None = None
    """The reason, when the agent said it could not interpret the message."""
    cancelled: str | None = None
    """Why the turn was cancelled before the agent answered."""
    summary: HistorySummary | None = None
    """The summary the engine made of the older history (it was over the budget), which the
    step records so later turns read it instead of the messages it covers."""


def parse_reply(answer: str) -> ConcernReply:
    """Split the agent's final text into reply text and proposal (or its refusal)."""
    stripped = answer.strip()
    if stripped.startswith(CANNOT):
        reason = stripped[len(CANNOT):].strip() or "the agent could not interpret the message"
        return ConcernReply(text="", proposal=None, could_not_interpret=reason)
    match = _JSON_BLOCK.search(stripped)
    proposal = None
    if match:
        try:
            proposal = Proposal.model_validate(json.loads(match.group(1)))
        except (ValueError, ValidationError):
            proposal = None
        stripped = (stripped[: match.start()] + stripped[match.end():]).strip()
    if not proposal or not proposal.concerns:
        proposal = None
    return ConcernReply(text=stripped, proposal=proposal)


# --- tools and the engine run ---------------------------------------------------------------


class SearchIssues(BaseModel):
    """The search tool's input."""

    query: str = Field(min_length=1, description="Keywords of the concern.")


class GetIssue(BaseModel):
    issue: str = Field(description="An issue id from search_issues.")


def concern_tools(catalog: IssueCatalog) -> ToolRegistry:
    """The agent's allow-listed, read-only tools."""

    def search_issues(args: SearchIssues, ctx: ToolContext) -> Ok:  # noqa: ARG001
        return Ok(rows=tuple(catalog.search(args.query)))

    def get_issue(args: GetIssue, ctx: ToolContext) -> Ok | Hint:  # noqa: ARG001
        issue = catalog.get(args.issue)
        if issue is None:
            near = [i["id"] for i in catalog.search(args.issue)]
            return Hint("unknown_issue", f"no issue {args.issue!r}; search first", tuple(near))
        return Ok(rows=({"id": issue["id"], "title": issue.get("title", ""),
                         "summary": issue.get("summary", "")},))

    return ToolRegistry((
        Tool("search_issues", "Find existing issues matching keywords, best first. Each row "
             "says why it was found (matched words, BM25 score, relevance 0-1); `strong` marks "
             "a match close enough to relate the concern to.", SearchIssues, search_issues),
        Tool("get_issue", "Read one issue by id.", GetIssue, get_issue),
    ))


def concern_spec(settings: VoiceSettings, catalog: IssueCatalog) -> AgentSpec:
    return AgentSpec(name=AGENT_NAME, identity=SYSTEM_PROMPT, tools=concern_tools(catalog),
                     model=settings.model, fallback_models=tuple(settings.fallback_models),
                     compaction_model=settings.compaction_model, max_output_tokens=1024,
                     history_token_budget=settings.history_token_budget)


async def run_concern_extraction(spec: AgentSpec, client: Any, sink: EffectSink,
                                 conversation: str, turn: str, attempt: int,
                                 history: list[dict[str, Any]],
                                 cancel: CancelToken | None = None) -> ConcernReply:
    """One turn of the agent over the transcript (ending with the participant's message)."""
    last = history[-1]["content"]
    cancel = cancel or CancelToken()
    result = await run_turn(spec, TurnInput(turn_id=turn, user_message=last,
                                            history=history[:-1], conversation_id=conversation,
                                            attempt=attempt), client, sink, cancel)
    if result.end_reason == "cancelled":
        return ConcernReply(text="", proposal=None, cancelled=cancel.reason or "cancelled")
    if result.end_reason == "error":
        raise ConcernAgentFailed("; ".join(f"{e.kind}: {e.message}" for e in result.errors),
                                 retryable=result.retryable)
    return dataclasses.replace(parse_reply(result.final_text),
                               summary=result.summary if result.summarised else None)


class ConcernAgentFailed(Exception):
    """The engine ended the turn with an error; the step retries (model unavailable, …)
    unless another attempt would meet the same refusal (``retryable``: a spent token quota,
    a model outside the registry), so the turn ends at once with the reason."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable
