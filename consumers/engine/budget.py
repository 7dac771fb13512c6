"""Model tokens per tenant per day, enforced where turns run.

``TokenBudget`` is one worker's count of what each tenant's turns used (input, cached input and
output tokens of every model call), over a day that opens at the tenant's first call
(``streams.quotas.WindowCounter``). ``TokenBudget.port`` wraps the model port for *one turn*: the
turn is admitted at its first model call if its tenant is under the budget, and from then on
every call it makes is counted and let through, so an admitted turn runs to its end (the
budget may be passed by at most the turns running when it is reached). A turn that starts over
the budget ends with ``TOKEN_QUOTA_EXCEEDED``, naming the tenant, the limit, the setting and
when it frees; no model is called for it.

The count is this worker process's memory: it is not shared between workers and a restarted
worker starts from zero (``docs/security.md``).
"""

from __future__ import annotations

import time
from collections.abc import Hashable

from consumers.engine.model import (
    ModelError,
    ModelPort,
    ModelRequest,
    ModelResponse,
    StreamCallbacks,
)
from streams.quotas import MAX_KEYS, Clock, OverQuota, WindowCounter, retry_seconds

DAY = 86_400.0
QUOTA_KIND = "TOKEN_QUOTA_EXCEEDED"
SETTING = "VOICE_QUOTA_TENANT_TOKENS_PER_DAY"


class TokenQuotaExceeded(ModelError):
    """A turn refused before its first model call: its tenant used its tokens for the day."""

    def __init__(self, tenant: str, limit: int, used: int, retry_after: float) -> None:
        super().__init__(QUOTA_KIND, f"tenant {tenant!r} has used {used} of its {limit} model "
                         f"tokens per day ({SETTING}); the quota frees in "
                         f"{retry_seconds(retry_after)} s", error_type="TokenQuotaExceeded",
                         status=429)
        self.tenant, self.limit, self.used, self.retry_after = tenant, limit, used, retry_after


class TokenBudget:
    """Per tenant, the model tokens this worker's turns used today; ``limit`` 0 is unlimited."""

    def __init__(self, limit: int, *, max_tenants: int = MAX_KEYS,
                 clock: Clock = time.monotonic) -> None:
        self.window = WindowCounter("tenant_tokens_per_day", limit, DAY, max_keys=max_tenants,
                                    clock=clock)

    @property
    def limit(self) -> int:
        return self.window.limit

    def used(self, tenant: Hashable) -> int:
        return self.window.used(tenant)

    def admit(self, tenant: str) -> None:
        """``TokenQuotaExceeded`` if ``tenant`` has no tokens left today."""
        try:
            self.window.check(tenant)
        except OverQuota as exc:
            raise TokenQuotaExceeded(tenant, self.limit, self.used(tenant),
                                     exc.retry_after) from None

    def spend(self, tenant: str, response: ModelResponse) -> None:
        u = response.usage
        self.window.spend(tenant, u.total_input + u.output_tokens)

    def port(self, inner: ModelPort, tenant: str) -> ModelPort:
        """``inner`` for one turn of ``tenant``: admitted at its first call, every call counted."""
        if self.window.unlimited:
            return inner
        return BudgetedModel(inner, self, tenant)


class BudgetedModel:
    """A ``ModelPort`` for one turn, counting its tenant's tokens (see the module docstring)."""

    def __init__(self, inner: ModelPort, budget: TokenBudget, tenant: str) -> None:
        self.inner, self.budget, self.tenant = inner, budget, tenant
        self.admitted = False

    async def stream(self, request: ModelRequest, callbacks: StreamCallbacks) -> ModelResponse:
        if not self.admitted:
            self.budget.admit(self.tenant)
            self.admitted = True
        response = await self.inner.stream(request, callbacks)
        self.budget.spend(self.tenant, response)
        return response
