"""The reasoning service: a deterministic reading of an issue's evidence.

Claims are the sentences of evidence bodies. A claim is *supported* by another piece of
evidence when one of its sentences shares enough content words with the claim and agrees in
polarity, *contradicted* when it shares them and one of the two is negated ("the lights are
not broken" against "the lights are broken"). Gaps are the issue's own statements (its title
and the sentences of its summary) that no evidence speaks to at all.

These are simple keyword and negation rules, on purpose: the research agent reads the result
through tools, and a rule a person can check beats a score nobody can. Same input, same
answer, same ids (hashes of the text), so a replayed research run reads the same records.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

_STOP = frozenset("""
a an the and or but so if then than that this these those there here it its is are was were be
been being am i me my we our us you your they them their he she his her of to in on at for from
by with about into over under as yes very really just also too can could would should will shall
do does did done have has had get got make made please want wants need needs some any all more
most many much lot lots thing things what when where which who why how one two per via
""".split())
_NEGATIONS = frozenset("""
not no never none nobody nothing neither nor cannot without
can't won't don't doesn't didn't isn't aren't wasn't weren't hasn't haven't hadn't shouldn't
couldn't wouldn't mustn't
""".split())
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[a-z][a-z'’]*")


def sentences(text: str) -> list[str]:
    """The sentences of a text, trimmed, empty ones dropped."""
    return [s.strip() for s in _SENTENCE.split(text or "") if s.strip()]


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _words(text: str) -> list[str]:
    return [w.replace("’", "'") for w in _WORD.findall(text.lower())]


def keywords(text: str) -> frozenset[str]:
    """Content words of a text (stop words and negations dropped, crude stems)."""
    return frozenset(_stem(w) for w in _words(text)
                     if len(w) >= 3 and w not in _STOP and w not in _NEGATIONS)


def negated(text: str) -> bool:
    """True when the sentence says "not" (an odd number of negations)."""
    n = sum(1 for w in _words(text) if w in _NEGATIONS or w.endswith("n't"))
    return n % 2 == 1


def related(a: frozenset[str], b: frozenset[str]) -> bool:
    """Two statements speak of the same thing: two shared content words, or one when either
    has at most two."""
    shared = len(a & b)
    return shared >= 2 or (shared >= 1 and min(len(a), len(b)) <= 2)


def _id(prefix: str, *parts: str) -> str:
    digest = hashlib.sha1("\x1f".join(parts).encode("utf-8")).hexdigest()[:10]
    return f"{prefix}-{digest}"


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    evidence: str
    """The evidence the sentence comes from."""
    supported_by: tuple[str, ...] = ()
    contradicted_by: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "evidence": self.evidence,
                "supported_by": list(self.supported_by),
                "contradicted_by": list(self.contradicted_by)}


@dataclass(frozen=True)
class Gap:
    id: str
    statement: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "statement": self.statement, "reason": self.reason}


@dataclass(frozen=True)
class Reading:
    """What the reasoning service says about one issue and its evidence."""

    claims: tuple[Claim, ...] = ()
    gaps: tuple[Gap, ...] = ()


def _evidence_sentences(evidence: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for ev in evidence:
        for s in sentences(ev.get("body") or ""):
            out.append((str(ev["evidence"]), s))
    return out


def read_issue(issue: dict[str, Any], evidence: list[dict[str, Any]]) -> Reading:
    """Claims with their supporting and contradicting evidence, and the issue's gaps.

    ``issue`` has ``issue``, ``title``, ``summary``; each evidence ``evidence``, ``title``,
    ``body`` (an evidence without a body — a bare URL — states no claims).
    """
    said = [(ev, s, keywords(s), negated(s)) for ev, s in _evidence_sentences(evidence)]
    claims: list[Claim] = []
    seen: set[str] = set()
    for ev, text, kw, neg in said:
        if len(kw) < 2:
            continue  # "Thanks." or "See above." is not a claim
        cid = _id("clm", ev, text)
        if cid in seen:
            continue
        seen.add(cid)
        supports: list[str] = []
        contradicts: list[str] = []
        for other, _o_text, o_kw, o_neg in said:
            if other == ev or not related(kw, o_kw):
                continue
            target = contradicts if neg != o_neg else supports
            if other not in target:
                target.append(other)
        claims.append(Claim(cid, text, ev, tuple(supports), tuple(contradicts)))
    statements = [s for s in [issue.get("title") or "", *sentences(issue.get("summary") or "")]
                  if s.strip()]
    gaps = []
    for statement in statements:
        kw = keywords(statement)
        if not any(related(kw, o_kw) for _ev, _t, o_kw, _n in said):
            gaps.append(Gap(_id("gap", str(issue.get("issue", "")), statement), statement,
                            "no evidence speaks to this statement of the issue"))
    return Reading(tuple(claims), tuple(gaps))
