"""Rendering an update from a development record: plain text, no model, same input → same text.

The update a follower gets must be exactly what staff recorded, so this only arranges it: the
issue's title as context, the development's title and body, who recorded it and when. Whitespace
is normalised (runs of blank lines collapsed, trailing spaces dropped); nothing is rewritten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

MAX_TITLE = 120


@dataclass(frozen=True)
class RenderedUpdate:
    title: str
    body: str

    def to_dict(self) -> dict[str, str]:
        return {"title": self.title, "body": self.body}


def _clean(text: str) -> str:
    lines = [line.rstrip() for line in (text or "").replace("\r\n", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _one_line(text: str, limit: int) -> str:
    flat = " ".join((text or "").split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1].rsplit(" ", 1)[0]
    return (cut if len(cut) >= limit // 2 else flat[: limit - 1]) + "…"


def _day(at: str) -> str:
    try:
        day = datetime.fromisoformat(at)
    except (TypeError, ValueError):
        return at or ""
    return f"{day.day} {day:%B %Y}"


def render_update(issue_title: str, title: str, body: str, at: str) -> RenderedUpdate:
    """The notification a follower of the issue gets for one development."""
    issue = _one_line(issue_title, MAX_TITLE) or "an issue you follow"
    heading = _one_line(title, MAX_TITLE) or "New development"
    parts = [f"Update on “{issue}”", "", heading]
    text = _clean(body)
    if text:
        parts += ["", text]
    day = _day(at)
    if day:
        parts += ["", f"Recorded {day}."]
    return RenderedUpdate(title=f"{issue}: {heading}", body="\n".join(parts))
