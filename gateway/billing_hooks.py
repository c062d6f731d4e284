"""The seam through which billing admits requests before the engine runs and settles them after.

app.state.gateway.billing holds an object with this shape; the default admits
everything and settles nothing. Billing installs its own (see docs/architecture.md).

Optional members are used when present: wrap_recorder(recorder) -> UsageRecorder
(to put billing's own handling around usage records), aclose() (called at
shutdown, after in-flight requests have finished), and `metrics`, a prometheus_client
collector (an object with collect()) that the app registers in its own registry, so that
/metrics serves billing's counters with the gateway's (gateway.metrics).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from kvgate.usage import STANDARD_TTLS_S, Endpoint, UsageEvent


@dataclass(frozen=True)
class Admission:
    """A request about to run: the worst case it may cost is prompt_tokens in, max_output_tokens out."""

    request_id: str
    tenant_id: str
    api_key_id: str
    model: str
    endpoint: Endpoint
    prompt_tokens: int
    max_output_tokens: int
    # The TTLs of the cache regions it may write (its prompt can only be billed at those write
    # rates or below); None when unknown: any class.
    write_ttls_s: tuple[int, ...] | None = None


class BillingHooks(Protocol):
    async def admit(self, admission: Admission) -> None:
        """Raise kvgate.errors.BillingError (402) to refuse the request before it runs."""
        ...

    async def release(self, admission: Admission) -> None:
        """The engine refused an admitted request (queue full, invalid): it never ran."""
        ...

    async def settle(self, event: UsageEvent) -> Decimal | None:
        """Charge a recorded request; the cost in USD (shown to the client) or None."""
        ...

    def allows_ttl(self, *, model: str, ttl_s: int) -> bool:
        """Whether a cache TTL class beyond STANDARD_TTLS_S is priced and may be used."""
        ...


class NoBilling:
    async def admit(self, admission: Admission) -> None:
        return None

    async def release(self, admission: Admission) -> None:
        return None

    async def settle(self, event: UsageEvent) -> Decimal | None:
        return None

    def allows_ttl(self, *, model: str, ttl_s: int) -> bool:
        return ttl_s in STANDARD_TTLS_S
