"""BM25 over small, per-tenant corpora: the analyzer, the index, and why a hit was chosen.

The scoring is ``rank_bm25``'s Okapi BM25 (term frequencies, document lengths, the vectorised
sum) with one change: the inverse document frequency is Lucene's,
``log(1 + (N - n + 0.5) / (n + 0.5))``, which is never negative. The library's own Okapi idf
goes negative for a word in more than half of the documents, so in a tenant with one or two
issues every match would score below zero — exactly the small corpora Voice starts with.

Two things sit on top of the score, both for the reader of a result (a model, a person):

- ``matched``: the query's words that hit the document, each as ``word`` or
  ``word~indexed`` when it matched a longer indexed word it heads or ends
  (``light~streetlight``): a compound a participant writes apart ("street lights") still
  finds the issue written as one word.
- ``relevance``: the score divided by the score the document's own head (an issue's title)
  would get as the query, clamped to 1 — how much of what the document is about the query
  covers, comparable across corpora of any size where the raw score is not.

Never does I/O; an index is immutable once built (a corpus that changes builds a new one).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rank_bm25 import BM25Okapi

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)
_STOP = frozenset("""
a an the and or but so if then than that this these those there here it its is are was were be
been being am i me my we our us you your they them their he she his her him of to in on at for
from by with about into over under as not no yes very really just also too can can't cannot
could would should will shall do does did done have has had get got make made please want wants
need needs some any all more most many much lot lots thing things what when where which who whom
why how again still even every because while being there's it's i'm don't doesn't isn't aren't
""".split())
MIN_COMPOUND_PART = 4
"""A query word shorter than this never matches inside a longer indexed word."""
MAX_EXPANSIONS = 3
"""At most this many indexed words stand for one query word that is not indexed itself."""


def _stem(word: str) -> str:
    """Plural endings off (``lights`` → ``light``, ``parties`` → ``party``), nothing else:
    light enough that a stem still reads as the word."""
    if word.endswith("sses"):
        return word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def terms(text: str) -> list[str]:
    """The words of ``text`` as the index sees them: lower case, stop words out, plurals
    stemmed, repeats kept (they are term frequency)."""
    out = []
    for raw in _WORD.findall(text.lower()):
        word = raw.replace("’", "'")
        if word in _STOP or len(word) < 2:
            continue
        word = word.split("'", 1)[0]
        if len(word) >= 2 and word not in _STOP:
            out.append(_stem(word))
    return out


@dataclass(frozen=True)
class Doc:
    """One document: its id, its text, and its head (what it is about; the whole text when
    empty) — the yardstick of ``Hit.relevance``."""

    id: str
    text: str
    head: str = ""


@dataclass(frozen=True)
class Hit:
    """A document the query found, with why."""

    id: str
    score: float
    """The BM25 score (unbounded; compare only within one search)."""
    relevance: float
    """0–1: the score over the score of the document's head as the query."""
    matched: tuple[str, ...]
    """The query words that hit it (``word`` or ``word~indexed``), in query order."""


class _LuceneBM25(BM25Okapi):
    """``rank_bm25``'s Okapi BM25 with Lucene's non-negative idf (see the module docstring)."""

    def _calc_idf(self, nd: dict[str, int]) -> None:
        n = self.corpus_size
        self.idf = {word: math.log(1 + (n - df + 0.5) / (df + 0.5)) for word, df in nd.items()}
        self.average_idf = sum(self.idf.values()) / len(self.idf) if self.idf else 0.0


class Ranker:
    """An immutable BM25 index over ``docs``; ``search`` ranks them for a query."""

    def __init__(self, docs: Sequence[Doc], k1: float = 1.2, b: float = 0.75) -> None:
        self.docs = list(docs)
        self._tokens = [terms(f"{d.head} {d.text}") for d in self.docs]
        self._bm25 = (_LuceneBM25([t or ["\0"] for t in self._tokens], k1=k1, b=b)
                      if self.docs else None)

    def __len__(self) -> int:
        return len(self.docs)

    def _expand(self, word: str) -> list[str]:
        """The indexed words ``word`` stands for: itself, else the longer indexed words it
        heads or ends (a compound), the rarest first."""
        assert self._bm25 is not None
        idf = self._bm25.idf
        if word in idf:
            return [word]
        if len(word) < MIN_COMPOUND_PART:
            return []
        longer = [w for w in idf if len(w) >= len(word) + 3
                  and (w.endswith(word) or w.startswith(word))]
        longer.sort(key=lambda w: (-idf[w], w))
        return longer[:MAX_EXPANSIONS]

    def search(self, query: str, limit: int = 5, floor: float = 0.0) -> list[Hit]:
        """The best ``limit`` documents for ``query`` with a relevance of at least ``floor``,
        best first (ties: the earlier document); none that no query word hits."""
        if self._bm25 is None or limit <= 0:
            return []
        asked: list[str] = []
        for word in terms(query):
            if word not in asked:
                asked.append(word)
        stands: dict[str, list[str]] = {w: self._expand(w) for w in asked}
        indexed = [w for ws in stands.values() for w in ws]
        if not indexed:
            return []
        scores = np.asarray(self._bm25.get_scores(indexed), dtype=float)
        hits: list[Hit] = []
        for i in sorted(range(len(self.docs)), key=lambda i: (-scores[i], i)):
            if scores[i] <= 0:
                break
            freqs = self._bm25.doc_freqs[i]
            matched = tuple(w if w == hit else f"{w}~{hit}"
                            for w, ws in stands.items() for hit in ws if hit in freqs)
            if not matched:
                continue
            head = self.docs[i].head or self.docs[i].text
            own = self._bm25.get_batch_scores(list(dict.fromkeys(terms(head))), [i])[0]
            relevance = min(1.0, float(scores[i]) / own) if own > 0 else 0.0
            if relevance < floor:
                continue
            hits.append(Hit(self.docs[i].id, round(float(scores[i]), 4), round(relevance, 3),
                            matched))
            if len(hits) >= limit:
                break
        return hits
