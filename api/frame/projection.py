"""The one read model of the edge: per-aggregate views fed by the tail, and waiting on them.

Every product's views are built the same way (rebuilt from Kafka at every start):

- a ``Projection`` holds one aggregate kind's views by key and wakes waiters per key
  (``notify`` / ``wait``), so a route or a stream that must see a write waits for it without
  polling;
- each view is an ``AggregateView``: it keeps the last seq it applied, so a record whose seq is
  not above it is a redelivery (``accept`` says no) and changes nothing;
- a view that streams to clients is a ``KeptEvents``: the last ``kept`` events for SSE resume,
  the oldest cursor it can still serve, and ``events_after(cursor)``, which raises the one
  ``CursorTooOld`` (→ 409 with the oldest cursor) when some of them are gone.

Everything runs on the edge's event loop (the tail hands records over with
``call_soon_threadsafe``). Nothing here does I/O.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from streams.envelope import Envelope

DEFAULT_KEPT = 10_000
"""Events kept per stream for resume when the settings do not say (``VOICE_EDGE_EVENTS_KEPT``)."""

RENDERED_KEPT = 4
"""Rendered events a view keeps for its streams: the newest few, which every live stream of
it sends within moments of each other (a stream further behind renders its own)."""

E = TypeVar("E")
R = TypeVar("R")
V = TypeVar("V")
K = TypeVar("K", bound="KeptEvents[Any]")


class Caller(Protocol):
    """Who reads a view: a subject in a tenant (``api.frame.auth.Principal``)."""

    @property
    def sub(self) -> str: ...

    @property
    def tenant(self) -> str: ...


class CursorTooOld(Exception):
    """The events after ``cursor`` are no longer all kept; ``oldest`` is the oldest cursor
    that can still be served."""

    def __init__(self, stream: str, cursor: int, oldest: int) -> None:
        super().__init__(f"cursor {cursor} of {stream} is older than this edge keeps; "
                         f"the oldest cursor it can serve is {oldest}")
        self.stream = stream
        self.cursor = cursor
        self.oldest = oldest


def _expire(fut: asyncio.Future[None]) -> None:
    """A wait's timer: end it unwoken (``Changes.wait`` then checks its deadline)."""
    if not fut.done():
        fut.set_result(None)


Push = Callable[[], bool]
"""A waiter's own handling of a change, run by ``Changes.notify`` on the loop instead of
waking it: True if it did all the change asked (the waiter sleeps on), False to be woken.
Never raises (a failure is a False)."""


class Changes:
    """Futures waiting per key, woken together when the key changes.

    A wait is one future and one timer on the loop (not ``asyncio.wait``, whose set, callbacks
    and extra future per call were a tenth of the edge loop under a fan-out burst); the
    waiters of a key are an insertion-ordered dict, so a wait that ends unwoken leaves in
    O(1) and a key's waiters wake in the order they came.

    A waiter may bring a ``Push``: a change is then first offered to it, and it is woken only
    if the push declines. A caught-up event stream writes a new event this way, in the
    tail's hand-over, rather than being woken to look (``api.frame.sse``).
    """

    def __init__(self) -> None:
        self._waiters: dict[str, dict[asyncio.Future[None], Push | None]] = {}

    def notify(self, key: str) -> None:
        waiters = self._waiters.pop(key, None)
        if not waiters:
            return
        woken: list[asyncio.Future[None]] | None = None
        for fut, push in waiters.items():
            if fut.done() or push is None or not push():
                if woken is None:
                    woken = []
                woken.append(fut)
        # The usual case: every waiter took the change and sleeps on, in the same dict.
        if woken is not None:
            for fut in woken:
                del waiters[fut]
                if not fut.done():
                    fut.set_result(None)
            if not waiters:
                return
        if (again := self._waiters.get(key)) is not None:  # a wait began meanwhile
            again.update(waiters)
        else:
            self._waiters[key] = waiters

    async def wait(self, key: str, until: Callable[[], bool], timeout: float,
                   push: Push | None = None) -> bool:
        """Wait at most ``timeout`` s until ``until()`` holds; returns whether it does.
        ``push``: offered every change first (see the class); the wait goes on while it
        takes them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not until():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(key, {})[fut] = push
            timer = loop.call_at(deadline, _expire, fut)
            try:
                await fut
            finally:
                timer.cancel()
                # Still registered when the timer (or a cancellation) ended it, not a notify.
                waiters = self._waiters.get(key)
                if waiters is not None and fut in waiters:
                    del waiters[fut]
                    if not waiters:
                        del self._waiters[key]
        return True

    def waiting(self, key: str) -> int:
        """How many waiters a key has (for tests and diagnostics)."""
        return len(self._waiters.get(key, ()))


@dataclass(kw_only=True)
class AggregateView:
    """What every view of one aggregate has: the last seq applied (its writer's dense seq)."""

    last_seq: int = 0
    tenant: str | None = None
    """The tenant the aggregate belongs to (from the record that made it): no caller of
    another tenant ever reads it."""

    def accept(self, env: Envelope) -> bool:
        """Whether ``env`` is new here (its seq above the last one); a redelivery is not."""
        if env.seq is None or env.seq <= self.last_seq:
            return False
        self.last_seq = env.seq
        return True

    def owned_by(self, owner: str) -> bool:
        """Whether ``owner`` may read this view (views without an owner say no)."""
        return False


@dataclass(kw_only=True)
class KeptEvents(AggregateView, Generic[E]):
    """A view whose events are streamed to clients: the last ``kept`` ones, for resume.

    A cursor is the position of the last event a client has (``cursor_of``: the seq, or the
    display seq of an assistant conversation); 0 reads from the start.
    """

    kept: int = DEFAULT_KEPT
    events: deque[E] = field(default_factory=deque)
    """The last ``kept`` events, in cursor order."""
    used_at: float = 0.0
    """``time.monotonic()`` when a request last asked for it or the log last changed it: with
    a history window, a view unused for the window is evicted
    (``api.frame.on_demand.OnDemandViews.evict_idle``)."""

    @property
    def stream_name(self) -> str:
        """What ``CursorTooOld`` calls this stream."""
        raise NotImplementedError

    @staticmethod
    def cursor_of(event: E) -> int:
        """The cursor position of ``event`` (its ``id:`` on the SSE stream)."""
        raise NotImplementedError

    def head(self) -> int:
        """The position the stream has reached (a client there has everything)."""
        return self.last_seq

    def keep(self, event: E) -> None:
        """Keep ``event`` for resume, dropping the oldest past ``kept``."""
        self.events.append(event)
        while len(self.events) > self.kept:
            self.events.popleft()

    def oldest_cursor(self) -> int:
        """The smallest ``after`` this view can serve every later event for."""
        return self.cursor_of(self.events[0]) - 1 if self.events else self.head()

    def events_after(self, cursor: int) -> list[E]:
        """Every kept event after ``cursor``, in order; ``CursorTooOld`` when some of them
        are no longer kept."""
        events = self.events
        # The usual case, a caught-up stream and one new event: that event alone.
        if (len(events) > 1 and self.cursor_of(events[-2]) <= cursor
                and self.cursor_of(events[-1]) > cursor):
            return [events[-1]]
        oldest = self.oldest_cursor()
        if cursor < oldest:
            raise CursorTooOld(self.stream_name, cursor, oldest)
        out: list[E] = []
        # From the newest back: a live reader asks for the last few, whatever is kept.
        for event in reversed(self.events):
            if self.cursor_of(event) <= cursor:
                break
            out.append(event)
        out.reverse()
        return out

    # --- rendered once per view, shared by every stream of it

    rendered: dict[int, Any] = field(default_factory=dict)
    """The last ``RENDERED_KEPT`` events as rendered for clients, by cursor (see
    ``render_once``); forgotten with the view's content."""

    def render_once(self, event: E, render: Callable[[E], R]) -> R:
        """``render(event)``, computed once for every stream of this view: a burst of events
        to many streams of one aggregate renders (opens, validates, serialises) each event
        once, not once per stream. Only for a rendering that is the same for every reader
        of the view (a conversation's streams are all its owner's)."""
        cursor = self.cursor_of(event)
        if cursor in self.rendered:
            out: R = self.rendered[cursor]
            return out
        out = render(event)  # raises (``StreamEnd``) before anything is kept
        self.rendered[cursor] = out
        if len(self.rendered) > RENDERED_KEPT:  # the oldest: streams move forward together
            del self.rendered[next(iter(self.rendered))]
        return out

    # --- transient events: streamed to whoever is connected, never part of the log's order

    live: deque[tuple[int, Any]] = field(default_factory=deque)
    """Transient events (e.g. a reply as the model writes it), numbered by ``live_head``;
    a stream sends those it has not sent, without ``id:`` — they are not resumable, the log's
    event that completes them is."""
    live_head: int = 0

    def add_live(self, item: Any, kept: int = 256) -> None:
        """Add a transient event, keeping the last ``kept``."""
        self.live_head += 1
        self.live.append((self.live_head, item))
        while len(self.live) > kept:
            self.live.popleft()

    def live_after(self, n: int) -> list[tuple[int, Any]]:
        """Transient events numbered above ``n``, in order."""
        return [(i, item) for i, item in self.live if i > n]

    def drop_live(self, gone: Callable[[Any], bool]) -> None:
        """Forget the transient events ``gone`` says the log has completed."""
        if self.live:
            self.live = deque((i, item) for i, item in self.live if not gone(item))


class Projection(Generic[V]):
    """One aggregate kind's views at the edge, by key, with wait/notify per key.

    Views are usually ``AggregateView``s; a compacted topic without seqs (contributions) keeps
    its latest records here instead and uses only the wait/notify.
    """

    def __init__(self) -> None:
        self.by_key: dict[str, V] = {}
        self._changes = Changes()

    def get(self, key: str) -> V | None:
        return self.by_key.get(key)

    def __getitem__(self, key: str) -> V:
        return self.by_key[key]

    def __contains__(self, key: object) -> bool:
        return key in self.by_key

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_key)

    def __len__(self) -> int:
        return len(self.by_key)

    def values(self) -> list[V]:
        return list(self.by_key.values())

    def tenant_of(self, key: str) -> str | None:
        """The tenant of ``key``'s aggregate (None when unknown)."""
        return getattr(self.by_key.get(key), "tenant", None)

    def in_tenant(self, key: str, tenant: str) -> V | None:
        """The view of ``key`` if its aggregate belongs to ``tenant`` (else None: 404)."""
        view = self.by_key.get(key)
        return view if view is not None and self.tenant_of(key) == tenant else None

    def owned(self, key: str, who: Caller) -> V | None:
        """The view if ``who`` may read it: its tenant's, and its owner (else None: 404,
        whoever's it is)."""
        view = self.in_tenant(key, who.tenant)
        return view if isinstance(view, AggregateView) and view.owned_by(who.sub) else None

    async def ensure(self, key: str, timeout: float) -> bool:
        """Load ``key``'s view from before this edge's history window if it has one there
        (``VOICE_EDGE_HISTORY_S``, decision 0011), waiting at most ``timeout``; whether that
        is settled (False: still reading). A projection that reads all history has nothing to
        load."""
        return True

    def notify(self, key: str) -> None:
        """Wake the waiters of ``key``: its view changed."""
        self._changes.notify(key)

    async def wait(self, key: str, until: Callable[[V | None], bool], timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until ``until(view)`` holds; returns whether it does.

        ``until`` is re-checked after every change of ``key`` (and at the start).
        """
        return await self._changes.wait(key, lambda: until(self.by_key.get(key)), timeout)

    def changed(self, key: str, until: Callable[[], bool], timeout: float,
                push: Push | None = None) -> Awaitable[bool]:
        """``wait`` for a predicate that does not need the view (a stream's ``Feed.wait``):
        no wrapper per wait, for every held stream's wait is alive as long as it is; with
        ``push``, a change is offered to it before it wakes the wait (``Changes``)."""
        return self._changes.wait(key, until, timeout, push)

    def waiting(self, key: str) -> int:
        """How many waiters a key has (for tests and diagnostics)."""
        return self._changes.waiting(key)


class StreamProjection(Projection[K]):
    """A ``Projection`` of views that stream: each keeps its last ``kept`` events."""

    def __init__(self, kept: int = DEFAULT_KEPT) -> None:
        if kept < 1:
            raise ValueError("kept must be at least 1")
        super().__init__()
        self.kept = kept
