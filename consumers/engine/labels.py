"""Behavioural labels of a user message: correction, meta-question/friction, and the previous
turn's outcome as judged from this reply. Regexes, no model: cheap, deterministic, replayable.

The labels are telemetry, so they carry no text of the message, only booleans and names.
"""

from __future__ import annotations

import re
from typing import Any, Literal

CORRECTION = re.compile(
    r"^\s*(no\b|nope\b|wrong\b|incorrect\b)|\b(that'?s|that is|this is|it'?s) (not|wrong|"
    r"incorrect)\b|\bnot what i (asked|meant|wanted|said)\b|\bi (meant|said|asked for)\b|"
    r"\b(actually|rather|instead)\b,?|\byou (misunderstood|got it wrong)\b", re.I)
FRICTION = re.compile(
    r"\bwhy (did|do|are|would|can'?t|won'?t) you\b|\bwhat are you doing\b|\bare you (even )?"
    r"(listening|reading|a bot)\b|\byou (keep|kept|still|didn'?t|did not|don'?t|do not|never)\b|"
    r"\b(this|that|it) (isn'?t|is not|doesn'?t|does not) (work|working|help|helping|helpful)\b|"
    r"\b(useless|frustrat\w*|annoying|confus\w*|ridiculous)\b|\?{2,}|\bagain\?", re.I)
POSITIVE = re.compile(
    r"\b(thanks?|thank you|great|perfect|exactly|that works|works now|awesome|helpful|got it|"
    r"nice|brilliant|excellent|looks good)\b", re.I)

Outcome = Literal["corrected", "friction", "accepted", "continued"]


def previous_outcome(text: str, correction: bool, friction: bool) -> Outcome:
    """How this reply judges the previous assistant turn."""
    if correction:
        return "corrected"
    if friction:
        return "friction"
    if POSITIVE.search(text):
        return "accepted"
    return "continued"


def label_message(text: str, has_previous_turn: bool) -> dict[str, Any]:
    """Content-free labels of one user message."""
    correction = bool(CORRECTION.search(text))
    friction = bool(FRICTION.search(text))
    return {
        "correction": correction,
        "meta_friction": friction,
        "previous_outcome": (previous_outcome(text, correction, friction)
                             if has_previous_turn else None),
        "message_chars": len(text),
    }
