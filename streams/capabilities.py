"""Roles and what they may do: the one table mapping each role to its capabilities.

Routes (and the telemetry query endpoint) require capabilities, never role names, so a role's
reach is read here in one place (seed 000's ``resolve_capabilities``). A principal's role is per
tenant (its membership); capabilities never cross tenants.
"""

from __future__ import annotations

from typing import Literal

Role = Literal["participant", "staff", "reviewer", "representative", "operator", "analyst"]
ROLES: tuple[Role, ...] = ("participant", "staff", "reviewer", "representative", "operator",
                           "analyst")

Capability = Literal[
    "converse",          # own conversations and assistant chats: create, read, stream, erase
    "issues.public",     # read published issues and contributions, follow, own inbox
    "contribute",        # contribute to an issue (sealed, reviewed before publication)
    "issues.manage",     # open issues, add evidence, record developments, start research
    "issues.read",       # the staff view of an issue (evidence, research runs)
    "investigate",       # open an investigation on an issue
    "reviews.read",      # the review queue and its decisions
    "reviews.decide",    # approve, redact or reject a contribution
    "workflows.read",    # workflow runs of the tenant and their failures
    "workflows.retry",   # retry a failed workflow of the tenant (never its sealed inputs)
    "telemetry.query",   # read-only SQL on the telemetry store
    "edge.inspect",      # an edge process's own state: what it holds, what its tail skipped
]

_PUBLIC: frozenset[Capability] = frozenset({"converse", "issues.public"})

CAPABILITIES: dict[Role, frozenset[Capability]] = {
    "participant": _PUBLIC | {"contribute"},
    "staff": _PUBLIC | {"issues.manage", "issues.read", "reviews.read", "workflows.read"},
    "representative": _PUBLIC | {"issues.read", "investigate"},
    "reviewer": _PUBLIC | {"reviews.read", "reviews.decide"},
    "operator": frozenset({"workflows.read", "workflows.retry", "telemetry.query",
                           "edge.inspect"}),
    "analyst": frozenset({"telemetry.query"}),
}


def resolve_capabilities(role: str) -> frozenset[Capability]:
    """What ``role`` may do; an unknown role may do nothing."""
    return CAPABILITIES.get(role, frozenset())  # type: ignore[call-overload]
