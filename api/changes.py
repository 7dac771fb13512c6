"""Waiting for a view to change: the one wait/notify used by every edge view.

Views call ``notify(key)`` when what ``key`` names changed (a conversation, an issue, an
inbox, …); a route awaits ``wait(key, until, timeout)``, which re-checks ``until()`` after each
change and gives up at the timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Changes:
    """Futures waiting per key, woken together when the key changes."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    def notify(self, key: str) -> None:
        for fut in self._waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait(self, key: str, until: Callable[[], bool], timeout: float) -> bool:
        """Wait at most ``timeout`` s until ``until()`` holds; returns whether it does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not until():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(key, []).append(fut)
            try:
                await asyncio.wait({fut}, timeout=remaining)
            finally:
                if not fut.done():
                    fut.cancel()
                    waiters = self._waiters.get(key)
                    if waiters is not None and fut in waiters:
                        waiters.remove(fut)
                        if not waiters:
                            del self._waiters[key]
        return True

    def waiting(self, key: str) -> int:
        """How many waiters a key has (for tests and diagnostics)."""
        return len(self._waiters.get(key, ()))
