"""How a consumer retries one record it could not process, before it dead-letters it.

One policy for every consumer (the worker's agents, the telemetry sink): a bounded number of
attempts with doubling backoff, short by default (``VOICE_CONSUMER_RETRY_*``), so one poison
record holds its consumer back for well under a second. Retryability is an attribute of the
failure, not a class tree (``retryable``): a failure that says ``retryable = False`` — a
record its consumer can never process (``Unprocessable``), a broker refusal that is not
retriable (a record too large) — is not tried again; any other failure is tried again up to
the policy's attempts, so a transient broker error gets its retries and a deterministic bug is
never retried forever.

It never decides what happens after the last attempt: the caller dead-letters the record
(``streams.dead_letters``) or, when even that fails, stops without committing it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from confluent_kafka import KafkaException

from streams.settings import VoiceSettings

Sleep = Callable[[float], Awaitable[None]]


class Unprocessable(Exception):
    """A record its consumer can never process (impossible content, no handler for its
    type): dead-lettered at once, never retried. Its message is Voice's own words."""

    retryable = False
    plain_message = True


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries of one record, ``initial_s`` before the second, doubling up to
    ``max_s`` between two."""

    attempts: int = 3
    initial_s: float = 0.2
    max_s: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts!r}")
        if self.initial_s < 0 or self.max_s < 0:
            raise ValueError(f"backoff must not be negative: {self.initial_s!r}, {self.max_s!r}")

    @classmethod
    def from_settings(cls, settings: VoiceSettings) -> RetryPolicy:
        """The policy ``VOICE_CONSUMER_RETRY_ATTEMPTS`` / ``_INITIAL_MS`` / ``_MAX_MS`` set."""
        return cls(settings.consumer_retry_attempts,
                   settings.consumer_retry_initial_ms / 1000,
                   settings.consumer_retry_max_ms / 1000)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return min(self.max_s, self.initial_s * 2 ** (attempt - 1))


def retryable(exc: BaseException) -> bool:
    """Whether trying ``exc``'s work again may help: False only when the failure says so."""
    if isinstance(exc, KafkaException) and exc.args:
        err = exc.args[0]
        if hasattr(err, "retriable") and hasattr(err, "fatal"):
            return bool(err.retriable()) and not err.fatal()
    flag = getattr(exc, "retryable", None)
    return flag is not False


async def attempt(work: Callable[[], Awaitable[object]], policy: RetryPolicy,
                  sleep: Sleep = asyncio.sleep) -> tuple[Exception | None, int]:
    """Run ``work`` until it succeeds, fails for good, or the policy's attempts are spent.

    Returns ``(None, attempts)`` on success, else ``(the last failure, attempts)``. Only
    ``Exception`` is caught: a cancellation goes through.
    """
    for n in range(1, policy.attempts + 1):
        try:
            await work()
            return None, n
        except Exception as exc:
            if n == policy.attempts or not retryable(exc):
                return exc, n
            await sleep(policy.delay(n))
    raise AssertionError("unreachable")  # pragma: no cover
