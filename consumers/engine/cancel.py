"""The cancellation token a turn is run with.

A cancel command (from the edge, through the log) sets it; the loop checks it before every model
call, and the tool dispatcher races each tool against it. It must never raise inside the loop:
cancelling is control flow, not an error.
"""

from __future__ import annotations

import asyncio


class CancelToken:
    """A one-way flag with an awaitable side; ``cancel`` is idempotent."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        """Set the flag (from the loop's thread); the first reason wins."""
        if not self._event.is_set():
            self._reason = reason
            self._event.set()

    def cancel_threadsafe(self, loop: asyncio.AbstractEventLoop, reason: str = "cancelled") -> None:
        """Set the flag from another thread."""
        loop.call_soon_threadsafe(self.cancel, reason)

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    @property
    def reason(self) -> str | None:
        return self._reason

    async def wait(self) -> None:
        """Return once the token is cancelled."""
        await self._event.wait()
