"""Patterns derived from ended turns, and picking the ones worth suggesting to the next turn.

After a turn ends, the extraction workflow records a ``provisional`` pattern at once (no model:
what was asked, which tools ran, how it ended) and then an ``extracted`` one, written by the
compaction agent from the exchange. A later turn ranks the patterns it may use — its own
conversation's, and the extracted ones its tenant learned in other conversations
(``consumers.assistant.library``) — by BM25 against its message (the ranker the issue catalog
uses, ``consumers.retrieval``) and carries the best few in ``[CURRENT_STATE]``, each with why it
was chosen. Pure functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from consumers.engine import AgentSpec, ToolRegistry
from consumers.retrieval import Doc, Ranker
from streams.assistant_settings import AssistantSettings

EXTRACTOR = "compaction"
EXTRACTOR_IDENTITY = (
    f"[agent: {EXTRACTOR}]\n"
    "You read one exchange between a person and Voice's data assistant and write down, in a few "
    "lines, the reusable operational pattern: what kind of question it was, which datasets and "
    "columns answered it, which tools and queries worked. No greetings."
)
SUGGESTED = 3

_STOP = frozenset("""
a an the and or but so if then than that this these those there here it its is are was were be
been am i me my we our us you your they them their he she his her of to in on at for from by
with about into over under as not no yes can could would should will do does did have has had
get got make please want need some any all more most many much what when where which who why
how show tell give find me let us also just only one each per data dataset datasets attached
columns rows row column id""".split())


@dataclass(frozen=True)
class Pattern:
    """An opened pattern."""

    pattern_id: str
    turn: str
    stage: str
    text: str
    keywords: tuple[str, ...]
    seq: int = 0
    conversation: str = ""
    """The conversation it was learned in (empty: the conversation of the turn using it)."""


@dataclass(frozen=True)
class Suggestion:
    """A pattern chosen for a turn, and why: the words of the message it matched and its BM25
    score among the candidates."""

    pattern: Pattern
    score: float
    matched: tuple[str, ...]
    elsewhere: bool = False
    """Learned in another conversation of the tenant (not the turn's own)."""

    @property
    def pattern_id(self) -> str:
        return self.pattern.pattern_id

    def why(self) -> str:
        """The reason shown in ``[CURRENT_STATE]``."""
        origin = "another conversation" if self.elsewhere else (
            f"this conversation, {self.pattern.turn.rpartition(':')[2]}")
        return (f"{self.pattern.stage}, {origin}; matched: {', '.join(self.matched)}; "
                f"BM25 {self.score:.2f}")


def keywords(text: str) -> list[str]:
    """Distinct content words (three letters or more, lower case, plural ``s`` dropped)."""
    out: list[str] = []
    for w in re.findall(r"[a-z][a-z0-9'-]+", text.lower()):
        w = w.strip("'-")
        if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        if len(w) >= 3 and w not in _STOP and w not in out:
            out.append(w)
    return out


def tools_used(chain: dict[str, Any]) -> list[str]:
    """Tool names called in a reply's chain, in order, each once."""
    names: list[str] = []
    for msg in chain.get("structured_content") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                name = str(block.get("name"))
                if name not in names:
                    names.append(name)
    return names


def provisional(request: dict[str, Any], chain: dict[str, Any]) -> dict[str, Any]:
    """The entry recorded at once, without a model."""
    message = " ".join(str(request.get("message", "")).split())[:200]
    tools = tools_used(chain)
    text = f"Asked: {message}" + (f" | tools: {', '.join(tools)}" if tools else "")
    names = [str(d.get("name")) for d in request.get("datasets") or []]
    if names:
        text += f" | datasets: {', '.join(names)}"
    return {"text": text, "keywords": keywords(f"{message} {' '.join(names)}")}


def extraction_prompt(request: dict[str, Any], chain: dict[str, Any]) -> str:
    """What the extractor reads: the exchange, condensed."""
    reply = " ".join(str(chain.get("text", "")).split())[:600]
    tools = ", ".join(tools_used(chain)) or "none"
    message = " ".join(str(request.get("message", "")).split())[:600]
    return (f"User asked: {message}\nTools used: {tools}\nAssistant answered: {reply}\n"
            "Write the operational pattern of this exchange.")


def extracted(text: str, request: dict[str, Any]) -> dict[str, Any]:
    """The extractor's answer as a pattern (its words and the request's)."""
    clean = " ".join(text.split())[:600]
    return {"text": clean, "keywords": keywords(f"{clean} {request.get('message', '')}")}


def rank(patterns: list[Pattern], message: str, k: int = SUGGESTED,
         conversation: str = "") -> list[Suggestion]:
    """The ``k`` patterns that BM25 ranks best for ``message`` (none that no word of it hits);
    per turn the extracted pattern stands in for its provisional one; equal scores go to the
    newest. A pattern learned in a conversation other than ``conversation`` is marked so."""
    best: dict[tuple[str, str], Pattern] = {}
    for p in patterns:
        held = best.get((p.conversation, p.turn))
        if held is None or (held.stage == "provisional" and p.stage == "extracted"):
            best[(p.conversation, p.turn)] = p
    newest_first = sorted(best.values(), key=lambda p: -p.seq)
    by_id = {p.pattern_id: p for p in newest_first}
    ranker = Ranker([Doc(p.pattern_id, f"{p.text} {' '.join(p.keywords)}")
                     for p in newest_first])
    return [Suggestion(by_id[h.id], h.score, h.matched,
                       elsewhere=bool(by_id[h.id].conversation)
                       and by_id[h.id].conversation != conversation)
            for h in ranker.search(message, k)]


def extractor_spec(settings: AssistantSettings) -> AgentSpec:
    """The extractor: the compaction model, no tools."""
    return AgentSpec(name=EXTRACTOR, identity=EXTRACTOR_IDENTITY, tools=ToolRegistry(),
                     model=settings.compaction_model, max_output_tokens=512,
                     max_agentic_turns=1)
