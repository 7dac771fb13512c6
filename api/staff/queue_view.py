"""The edge's view of each tenant's review queue (``voice.review-queue``): the queue's events
kept for the SSE stream, and the queue as those events leave it (who waits for which review).

The queue's single writer gives each event a dense per-tenant seq, the stream's ``id:``; the
view dedupes by seq (a replayed record) and by event id (an event the writer recorded again
under a new seq, past its memory), and shows nothing of a contribution after its ``erased``.
``waiting`` is the fold of every event this edge applied — not only the kept ones — so
``GET /staff/reviews/queue`` and the stream after its ``last_seq`` are one consistent reading
of one log. Nothing here opens sealed content or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from api.frame.projection import KeptEvents, StreamProjection
from schemas.staff import QueueEventRecorded
from streams.envelope import Envelope
from streams.ids import review_queue_key


@dataclass(kw_only=True)
class ReviewQueueView(KeptEvents[Envelope]):
    """One tenant's review queue: its events (for resume) and what waits for a reviewer."""

    ids: set[str] = field(default_factory=set)
    """Event ids seen: a writer's replay under a new seq is not shown twice."""
    waiting: dict[str, Envelope] = field(default_factory=dict)
    """Contribution → its latest event (with its seq), for those waiting for a review."""
    erased: set[str] = field(default_factory=set)
    """Contributions their authors erased: any later event of theirs (a step that was running
    as the erasure came) is not shown, on every edge alike."""

    @property
    def stream_name(self) -> str:
        return f"review queue of {self.tenant!r}"

    @staticmethod
    def cursor_of(event: Envelope) -> int:
        return event.seq or 0

    def fold(self, env: Envelope) -> None:
        """Apply one event to ``waiting``: an entry waits while it names a review to give."""
        rec = env.record
        assert isinstance(rec, QueueEventRecorded)
        if rec.waiting_for is None:
            self.waiting.pop(rec.contribution, None)
        else:
            self.waiting[rec.contribution] = env


class ReviewQueues(StreamProjection[ReviewQueueView]):
    """Each tenant's review queue, by queue key."""

    def apply(self, env: Envelope) -> None:
        rec = env.record
        if not isinstance(rec, QueueEventRecorded) or env.seq is None:
            return
        view = self.by_key.get(env.key)
        if view is None:
            view = self.by_key[env.key] = ReviewQueueView(tenant=env.tenant, kept=self.kept)
        if not view.accept(env):
            return  # a writer's replay: same seq, same record
        if rec.queue_event not in view.ids and rec.contribution not in view.erased:
            view.ids.add(rec.queue_event)
            if rec.event == "erased":
                view.erased.add(rec.contribution)
            view.fold(env)
            view.keep(env)
        self.notify(env.key)

    def queue(self, tenant: str) -> ReviewQueueView:
        """``tenant``'s review queue (empty when nothing came yet)."""
        view = self.by_key.get(review_queue_key(tenant))
        if view is None or view.tenant != tenant:  # a key of another tenant's: not its queue
            return ReviewQueueView(tenant=tenant, kept=self.kept)
        return view
