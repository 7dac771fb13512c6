"""The issue catalog the concern agent searches: every issue of every tenant, kept from
``voice.issues`` on every worker, ranked by BM25 (``consumers.retrieval``).

A conversation's turn may run on any worker, and an issue's records live on whichever
partition its id hashes to, so each worker follows the whole issues log itself
(``consumers.frame.follow``) and keeps an ``IssueIndex``: per tenant, each issue's title and
summary as opened, and the titles of its evidence and developments as they are added. A search
is scoped to one tenant before it starts (``for_tenant``): another tenant's issue is not in the
corpus it ranks, so it can never be found, scored or fetched by id.

Each hit says why it was found (``matched``, ``score``, ``relevance``) and whether it is
``strong``: relevance at least ``STRONG_RELEVANCE`` with at least two query words matched —
the bar for relating a concern to it rather than proposing a new issue.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from consumers.retrieval import Doc, Ranker
from schemas.staff import DevelopmentRecorded, EvidenceAdded, IssueOpened
from streams.envelope import Envelope

STRONG_RELEVANCE = 0.6
"""A hit at least this relevant (and matching two words or more) is a strong match."""
STRONG_MIN_MATCHED = 2
MAX_DETAIL_TITLES = 20
"""Evidence and development titles kept per issue (the most recent)."""
FRESH_S = 5.0
"""How long a search waits for its worker to have read the issues log up to now."""


class IssueCatalog(Protocol):
    """Read-only access to the issues of one tenant, which the agent may relate concerns to."""

    def search(self, query: str, limit: int = 5) -> list[dict[str, Any]]: ...

    def get(self, issue: str) -> dict[str, Any] | None: ...


class IssueSource(Protocol):
    """Where a turn gets its tenant's catalog."""

    def for_tenant(self, tenant: str | None) -> IssueCatalog: ...


@dataclass
class _Issue:
    id: str
    title: str
    summary: str
    seq: int = 0
    details: list[str] = field(default_factory=list)
    """Titles of its evidence and developments, most recent last."""

    def doc(self) -> Doc:
        return Doc(self.id, " ".join([self.summary, *self.details]), head=self.title)


class IssueIndex:
    """Every issue by tenant, and one BM25 index per tenant built when first searched after a
    change. Thread-safe: the follower applies records on its thread, turns search on theirs."""

    def __init__(self) -> None:
        self._issues: dict[str | None, dict[str, _Issue]] = {}
        self._rankers: dict[str | None, Ranker] = {}
        self._lock = threading.Lock()

    def apply(self, env: Envelope) -> None:
        """Fold one record of the issues log (redeliveries are ignored by seq)."""
        rec = env.record
        with self._lock:
            issues = self._issues.setdefault(env.tenant, {})
            if isinstance(rec, IssueOpened):
                if rec.issue not in issues:
                    issues[rec.issue] = _Issue(rec.issue, rec.title, rec.summary, env.seq or 0)
                    self._rankers.pop(env.tenant, None)
                return
            issue = issues.get(getattr(rec, "issue", ""))
            if issue is None or (env.seq is not None and env.seq <= issue.seq):
                return
            issue.seq = env.seq or issue.seq
            if isinstance(rec, (EvidenceAdded, DevelopmentRecorded)):
                issue.details = [*issue.details, rec.title][-MAX_DETAIL_TITLES:]
                self._rankers.pop(env.tenant, None)

    def add(self, tenant: str | None, issue: str, title: str, summary: str = "") -> None:
        """Put one issue in directly (tests, tools that already hold it)."""
        with self._lock:
            self._issues.setdefault(tenant, {})[issue] = _Issue(issue, title, summary)
            self._rankers.pop(tenant, None)

    def search(self, tenant: str | None, query: str, limit: int = 5) -> list[dict[str, Any]]:
        """The tenant's best issues for ``query``, each with why it was found."""
        with self._lock:
            issues = self._issues.get(tenant, {})
            ranker = self._rankers.get(tenant)
            if ranker is None:
                ranker = self._rankers[tenant] = Ranker([i.doc() for i in issues.values()])
            found = [(hit, issues[hit.id]) for hit in ranker.search(query, limit)]
        return [{"id": issue.id, "title": issue.title, "summary": issue.summary,
                 "score": hit.score, "relevance": hit.relevance, "matched": list(hit.matched),
                 "strong": hit.relevance >= STRONG_RELEVANCE
                 and len(hit.matched) >= STRONG_MIN_MATCHED}
                for hit, issue in found]

    def get(self, tenant: str | None, issue: str) -> dict[str, Any] | None:
        """One issue of the tenant (None for an unknown one, or another tenant's)."""
        with self._lock:
            found = self._issues.get(tenant, {}).get(issue)
            return None if found is None else {"id": found.id, "title": found.title,
                                                "summary": found.summary}

    def for_tenant(self, tenant: str | None,
                   sync: Callable[[], object] | None = None) -> TenantIssues:
        """The catalog of one tenant; ``sync`` runs before each search (read-your-writes)."""
        return TenantIssues(self, tenant, sync)


@dataclass(frozen=True)
class TenantIssues:
    """One tenant's view of an ``IssueIndex`` (an ``IssueCatalog``)."""

    index: IssueIndex
    tenant: str | None
    sync: Callable[[], object] | None = None

    def search(self, query: str, limit: int = 5) -> list[dict[str, Any]]:
        if self.sync is not None:
            self.sync()
        return self.index.search(self.tenant, query, limit)

    def get(self, issue: str) -> dict[str, Any] | None:
        if self.sync is not None:
            self.sync()
        return self.index.get(self.tenant, issue)


class FollowedIssues:
    """The worker's catalog: an ``IssueIndex`` fed by a follower of ``voice.issues``."""

    def __init__(self, index: IssueIndex, fresh: Callable[[float], bool]) -> None:
        self.index = index
        self._fresh = fresh

    def for_tenant(self, tenant: str | None) -> IssueCatalog:
        return self.index.for_tenant(tenant, lambda: self._fresh(FRESH_S))


class MemoryIssueCatalog:
    """Issues held in memory, all of one tenant (tests, replay): an ``IssueCatalog`` and an
    ``IssueSource`` that gives the same issues to every tenant."""

    def __init__(self, issues: list[dict[str, Any]] | None = None) -> None:
        self.index = IssueIndex()
        for i in issues or []:
            self.index.add(None, i["id"], i.get("title", ""), i.get("summary", ""))

    def search(self, query: str, limit: int = 5) -> list[dict[str, Any]]:
        return self.index.search(None, query, limit)

    def get(self, issue: str) -> dict[str, Any] | None:
        return self.index.get(None, issue)

    def for_tenant(self, tenant: str | None) -> IssueCatalog:  # noqa: ARG002
        return self
