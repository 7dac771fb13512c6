"""Quota counters in one process's memory: units per window per key, and open slots per key.

The edge counts requests per principal with them (``api.frame.quotas``) and the worker counts
model tokens per tenant (``consumers.engine.budget``), so both live here, on neither side of the
wall. Both are plain objects with an injectable clock (tests move time, never sleep), and both
keep bounded memory. What they count is what *this process* saw: nothing here is shared between
processes (``docs/security.md`` says what that means for a deployment).

A limit of 0 means unlimited: nothing is counted or kept.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

Clock = Callable[[], float]
"""Seconds on a clock that never goes back (``time.monotonic`` outside tests)."""

MAX_KEYS = 100_000
"""Keys a counter remembers at most unless told otherwise."""


class OverQuota(Exception):  # noqa: N818 - a refusal, named for what the caller is
    """A key is over its quota; ``retry_after`` is the time (s) until it may try again."""

    def __init__(self, quota: str, limit: int, retry_after: float) -> None:
        super().__init__(f"over the quota {quota!r} (limit {limit}); retry after "
                         f"{retry_seconds(retry_after)} s")
        self.quota, self.limit, self.retry_after = quota, limit, retry_after


def retry_seconds(retry_after: float) -> int:
    """``retry_after`` as a ``Retry-After`` value: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(retry_after))


@dataclass
class _Window:
    started: float
    used: int = 0


class WindowCounter:
    """At most ``limit`` units per ``window_s`` per key.

    A key's window opens at its first unit and lasts ``window_s``; the next unit after that
    opens a new one (a fixed window per key, so no clock alignment and O(1) memory per key).
    Memory is bounded: windows are kept in the order they opened, expired ones are dropped as
    new ones open, and past ``max_keys`` live keys the oldest window is forgotten — that key
    starts afresh, which errs towards admitting rather than towards growing without bound.
    """

    def __init__(self, quota: str, limit: int, window_s: float, *, max_keys: int = MAX_KEYS,
                 clock: Clock = time.monotonic) -> None:
        if limit < 0 or window_s <= 0 or max_keys < 1:
            raise ValueError(f"quota {quota!r}: limit {limit!r} must be >= 0, window "
                             f"{window_s!r} > 0, max_keys {max_keys!r} >= 1")
        self.quota, self.limit, self.window_s = quota, limit, window_s
        self.max_keys, self.clock = max_keys, clock
        self._windows: OrderedDict[Hashable, _Window] = OrderedDict()

    @property
    def unlimited(self) -> bool:
        return self.limit == 0

    def __len__(self) -> int:
        """Keys remembered now (expired ones included until they are dropped)."""
        return len(self._windows)

    def take(self, key: Hashable, cost: int = 1) -> None:
        """Count ``cost`` units for ``key``; ``OverQuota`` (nothing counted) past the limit."""
        if self.unlimited:
            return
        now = self.clock()
        window = self._current(key, now) or self._open(key, now)
        if window.used + cost > self.limit:
            raise OverQuota(self.quota, self.limit, self._left(window, now))
        window.used += cost

    def spend(self, key: Hashable, amount: int) -> None:
        """Count ``amount`` units already used (past the limit too: they were used)."""
        if self.unlimited or amount <= 0:
            return
        now = self.clock()
        window = self._current(key, now) or self._open(key, now)
        window.used += amount

    def check(self, key: Hashable) -> None:
        """``OverQuota`` if ``key`` has used its whole limit in its current window."""
        if self.unlimited:
            return
        now = self.clock()
        window = self._current(key, now)
        if window is not None and window.used >= self.limit:
            raise OverQuota(self.quota, self.limit, self._left(window, now))

    def used(self, key: Hashable) -> int:
        """Units ``key`` has used in its current window."""
        window = self._current(key, self.clock())
        return 0 if window is None else window.used

    def _left(self, window: _Window, now: float) -> float:
        return max(0.0, window.started + self.window_s - now)

    def _current(self, key: Hashable, now: float) -> _Window | None:
        window = self._windows.get(key)
        if window is not None and now - window.started >= self.window_s:
            del self._windows[key]
            return None
        return window

    def _open(self, key: Hashable, now: float) -> _Window:
        # Windows sit in the order they opened: expired ones are at the front.
        while self._windows:
            oldest = next(iter(self._windows.values()))
            if now - oldest.started < self.window_s and len(self._windows) < self.max_keys:
                break
            self._windows.popitem(last=False)
        window = self._windows[key] = _Window(now)
        return window


class Slot:
    """One open slot of a ``ConcurrencyCounter``; ``release`` gives it back (once)."""

    def __init__(self, release: Callable[[], None] | None = None) -> None:
        self._release = release

    def release(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release()


class ConcurrencyCounter:
    """At most ``limit`` slots open at once per key (streams, say).

    Only keys with an open slot are kept, so memory follows what is open now. A refusal's
    ``retry_after`` is when the key's oldest slot must have closed: every slot is held at most
    ``hold_s`` (a stream ends before the gateway bound), so that is an upper bound.
    """

    def __init__(self, quota: str, limit: int, hold_s: float, *,
                 clock: Clock = time.monotonic) -> None:
        if limit < 0 or hold_s <= 0:
            raise ValueError(f"quota {quota!r}: limit {limit!r} must be >= 0, hold "
                             f"{hold_s!r} > 0")
        self.quota, self.limit, self.hold_s, self.clock = quota, limit, hold_s, clock
        self._open: dict[Hashable, dict[int, float]] = {}
        self._ids = itertools.count()

    def open(self, key: Hashable) -> int:
        """Slots ``key`` holds now."""
        return len(self._open.get(key, ()))

    def __len__(self) -> int:
        """Keys holding a slot now."""
        return len(self._open)

    def acquire(self, key: Hashable) -> Slot:
        """A slot for ``key``; ``OverQuota`` when it already holds ``limit``."""
        if self.limit == 0:
            return Slot()
        now = self.clock()
        held = self._open.setdefault(key, {})
        if len(held) >= self.limit:
            oldest = min(held.values())
            raise OverQuota(self.quota, self.limit, max(0.0, oldest + self.hold_s - now))
        slot_id = next(self._ids)
        held[slot_id] = now

        def release() -> None:
            mine = self._open.get(key)
            if mine is not None:
                mine.pop(slot_id, None)
                if not mine:
                    del self._open[key]

        return Slot(release)
