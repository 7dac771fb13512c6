"""The concern-extraction agent: reads a participant's conversation and proposes concerns.

Its answer is human-readable text, optionally followed by a fenced ``json`` block holding a
``Proposal``; an answer starting ``COULD_NOT_INTERPRET:`` means it could not interpret the
message. The agent has no memory of its own: the transcript is handed to it per turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pydantic import ValidationError

from schemas.conversation import Proposal

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
