"""Random bytes from the operating system's CSPRNG, read a few KiB at a time.

Why: ``os.urandom`` (and ``uuid.uuid4`` and ``secrets``, which call it) gives up the GIL for
its ``getrandom()`` system call. In a process with a second busy thread, that thread takes the
GIL, and the caller waits until it gives it back: up to the switch interval (5 ms). The worker's
step thread seals ~15 pieces of content a turn, and each seal's nonce waited 250 µs on average
for the GIL (docs/benchmarks.md, issue 14, twentieth pass); the edge waited 40–80 µs for each
record id. One call for ``POOL_BYTES`` pays that wait once for hundreds of nonces and ids.

The bytes are the same CSPRNG's bytes ``os.urandom`` returns, and each is handed out once. A
forked child starts with an empty pool, so parent and child never share bytes.

This module must never hand out a byte twice, and never derive bytes from anything but the
operating system's CSPRNG.
"""

from __future__ import annotations

import os
import threading
import uuid

POOL_BYTES = 4096
"""Bytes read from the operating system at a time: 341 nonces or 256 ids."""


class _Pool:
    def __init__(self) -> None:
        self.forget()

    def take(self, n: int) -> bytes:
        if n > POOL_BYTES:
            return os.urandom(n)
        with self._lock:
            at = self._at
            if at + n > len(self._buffer):
                self._buffer, at = os.urandom(POOL_BYTES), 0
            self._at = at + n
            return self._buffer[at:at + n]

    def forget(self) -> None:
        """In a forked child: a new lock (the parent's may have been held) and no bytes."""
        self._lock = threading.Lock()
        self._buffer = b""
        self._at = 0


_pool = _Pool()
os.register_at_fork(after_in_child=_pool.forget)


def random_bytes(n: int) -> bytes:
    """``n`` bytes from the operating system's CSPRNG, never handed out before."""
    if n < 0:
        raise ValueError(f"n must not be negative: {n!r}")
    return _pool.take(n)


def random_hex(n: int) -> str:
    """``n`` random bytes as ``2n`` lowercase hex digits (``secrets.token_hex``'s form)."""
    return random_bytes(n).hex()


def random_uuid_hex() -> str:
    """A random (version 4) UUID as 32 hex digits, the form of ``uuid.uuid4().hex``."""
    return uuid.UUID(bytes=random_bytes(16), version=4).hex
