"""Who is calling: the principal of a request, from its verified token and the tenant it asks
for (seed 000 §2): ``X-Tenant-ID`` → the token's tenant claim → its first membership → the
deployment's default. A tenant the bearer is not a member of is refused (403, ``TenantRefused``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from streams.capabilities import Capability, Role, resolve_capabilities
from streams.tokens import Claims


class Principal(BaseModel):
    """The caller in the active tenant: subject, its role there, and what that role may do."""

    model_config = ConfigDict(frozen=True)

    sub: str
    role: Role
    tenant: str = "default"
    capabilities: frozenset[Capability] = frozenset()

    def can(self, capability: Capability) -> bool:
        return capability in self.capabilities


class TenantRefused(Exception):
    """The request names a tenant its bearer is not a member of."""


def resolve_principal(claims: Claims, requested: str | None, default_tenant: str) -> Principal:
    """The principal ``claims`` give in tenant ``requested`` (the ``X-Tenant-ID`` header), or in
    the claimed tenant, the first membership, the default — in that order."""
    roles = claims.member_roles(default_tenant)
    if requested is not None:
        if requested not in roles:
            raise TenantRefused(f"not a member of tenant {requested!r}")
        tenant = requested
    else:
        tenant = next(iter(roles))
    role = roles[tenant]
    return Principal(sub=claims.sub, role=role, tenant=tenant,
                     capabilities=resolve_capabilities(role))
