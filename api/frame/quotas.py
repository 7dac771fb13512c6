"""The edge's quotas per principal (tenant, sub): messages per minute, conversations and
uploads per day, concurrent SSE streams. Over one → ``429`` with ``Retry-After`` (whole seconds
until it frees) and a detail naming the quota, its limit and its setting.

Routes take them as dependencies: ``quota("messages")`` charges one unit once the caller has
the capability (after 401/403, before the route runs); ``stream_slot()`` holds one of the
caller's stream slots until the response ends — the stream's last event, or the client gone.
A route that decides late (the chat streams only when asked; a chat without a conversation
opens one) takes ``AdmissionDep`` and calls it. The counters are this edge process's memory
(``streams.quotas``): with several edges, each counts what it serves.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import Depends, HTTPException, Request

from api.frame.auth import Principal
from api.frame.deps import PrincipalDep, require
from streams.capabilities import Capability
from streams.quotas import Clock, ConcurrencyCounter, OverQuota, Slot, WindowCounter, retry_seconds
from streams.settings import VoiceSettings

Quota = Literal["messages", "conversations", "uploads"]
MINUTE, DAY = 60.0, 86_400.0

TOO_MANY = {429: {
    "description": "Over a quota of the caller's (the detail names it and its limit); "
                   "retry after Retry-After seconds.",
    "headers": {"Retry-After": {"description": "Seconds until the quota frees a slot.",
                                "schema": {"type": "integer", "minimum": 1}}}}}
"""The 429 of every route with a quota, for the OpenAPI document."""


@dataclass(frozen=True)
class _Rule:
    unit: str
    setting: str


RULES: dict[str, _Rule] = {
    "messages": _Rule("messages per minute", "VOICE_QUOTA_MESSAGES_PER_MINUTE"),
    "conversations": _Rule("new conversations per day", "VOICE_QUOTA_CONVERSATIONS_PER_DAY"),
    "uploads": _Rule("uploads per day", "VOICE_QUOTA_UPLOADS_PER_DAY"),
    "streams": _Rule("open streams", "VOICE_QUOTA_STREAMS"),
}


class EdgeQuotas:
    """This edge's counters, one per quota, keyed by principal."""

    def __init__(self, settings: VoiceSettings, clock: Clock = time.monotonic) -> None:
        keys = settings.quota_tracked_keys
        self.windows: dict[Quota, WindowCounter] = {
            "messages": WindowCounter("messages", settings.quota_messages_per_minute, MINUTE,
                                      max_keys=keys, clock=clock),
            "conversations": WindowCounter("conversations", settings.quota_conversations_per_day,
                                           DAY, max_keys=keys, clock=clock),
            "uploads": WindowCounter("uploads", settings.quota_uploads_per_day, DAY,
                                     max_keys=keys, clock=clock),
        }
        self.streams = ConcurrencyCounter("streams", settings.quota_streams,
                                          settings.gateway_bound_s, clock=clock)


def key_of(principal: Principal) -> tuple[str, str]:
    """Whose quota a request counts against: the same ``sub`` in two tenants is two."""
    return (principal.tenant, principal.sub)


def too_many(exc: OverQuota) -> HTTPException:
    """The 429 of a refusal: the quota, its limit, its setting, and ``Retry-After``."""
    rule = RULES[exc.quota]
    wait = retry_seconds(exc.retry_after)
    return HTTPException(429, f"over the quota of {exc.limit} {rule.unit} ({rule.setting}); "
                              f"retry after {wait} s", headers={"Retry-After": str(wait)})


def edge_quotas(request: Request) -> EdgeQuotas:
    """The app's quotas, built from its settings on first use (a test may set its own)."""
    quotas = getattr(request.app.state, "quotas", None)
    if quotas is None:
        quotas = request.app.state.quotas = EdgeQuotas(request.app.state.settings)
    return quotas


@dataclass
class Admission:
    """One request's claims on its principal's quotas; the stream slots it took are released
    when the request's response ends (``admission`` is a dependency with an exit)."""

    quotas: EdgeQuotas
    principal: Principal
    slots: list[Slot] = field(default_factory=list)

    def charge(self, quota: Quota) -> None:
        """Count one unit of ``quota``; 429 when the principal has none left."""
        charge(self.quotas, self.principal, quota)

    def open_stream(self) -> None:
        """Hold one of the principal's stream slots for this response; 429 when all are held."""
        self.slots.append(hold_stream(self.quotas, self.principal))

    def release(self) -> None:
        for slot in self.slots:
            slot.release()
        self.slots.clear()


def charge(quotas: EdgeQuotas, principal: Principal, quota: Quota) -> None:
    """Count one unit of ``principal``'s ``quota``; 429 when it has none left."""
    try:
        quotas.windows[quota].take(key_of(principal))
    except OverQuota as exc:
        raise too_many(exc) from None


def hold_stream(quotas: EdgeQuotas, principal: Principal) -> Slot:
    """One of ``principal``'s stream slots, for its holder to release; 429 when all are
    held."""
    try:
        return quotas.streams.acquire(key_of(principal))
    except OverQuota as exc:
        raise too_many(exc) from None


async def admission(request: Request, principal: PrincipalDep) -> AsyncIterator[Admission]:
    """The request's ``Admission``, shared by every dependency of the request (FastAPI caches
    it), released after the response is sent."""
    held = Admission(edge_quotas(request), principal)
    try:
        yield held
    finally:  # the response is over: sent to its end, failed, or its client went away
        held.release()


AdmissionDep = Annotated[Admission, Depends(admission)]


def quota(name: Quota, capability: Capability = "converse") -> Any:
    """A route dependency charging one unit of ``name`` to a caller with ``capability``.

    Not through ``admission``: a charge holds nothing until the response ends, and FastAPI
    solves every occurrence of a dependency's sub-tree again, cached or not (the principal's
    and its bearer's), and enters a dependency with an exit on its exit stack — together ~60 µs
    of a POST's dependencies on an idle core (docs/benchmarks.md, thirty-fifth pass)."""
    allowed = Depends(require(capability))

    # The capability first (dependencies resolve in this order): a caller refused 401/403
    # uses no quota.
    async def charged(request: Request, *, principal: Principal = allowed) -> None:
        charge(edge_quotas(request), principal, name)

    return Depends(charged)


def stream_slot(capability: Capability = "converse") -> Any:
    """A route dependency holding one of the caller's stream slots until the response ends."""
    allowed = Depends(require(capability))

    # The capability first, as for ``quota``: a caller refused 401/403 holds no slot.
    async def claimed(*, principal: Principal = allowed, held: AdmissionDep) -> None:
        held.open_stream()

    return Depends(claimed)
