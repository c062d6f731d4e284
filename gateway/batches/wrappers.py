"""The gateway as a batch item sees it: the same state, with the engine, the usage recorder and billing
wrapped so that the interactive generation path (gateway.generation) runs the item unchanged.

- the engine gets the item at the tenant's batch share: FairShare(f"{tenant}:batch", BATCH_WEIGHT), its own
  low-weight queue beside the tenant's interactive one;
- the usage record and the settlement are the interactive ones with `batch` set (billing prices it at the
  price version's batch rates); an attempt the runner itself stopped (shutdown) is recorded `interrupted`,
  so it is free, and the item runs again under a new request id.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

from gateway.billing_hooks import Admission, BillingHooks
from gateway.state import Gateway
from gateway.usage import UsageRecorder
from inference.types import FairShare
from kvgate.usage import UsageEvent

BATCH_WEIGHT = 1
"""The batch share's weight; interactive shares weigh the tenant's scheduling_weight (1 to 100)."""


def batch_share(share: FairShare | None) -> FairShare:
    key = share.key if share is not None else ""
    return FairShare(key=f"{key}:batch", weight=BATCH_WEIGHT)


class BatchEngine:
    """The engine client, submitting at the batch share."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def prepare(self, sampling: Any, *, share: FairShare | None = None) -> None:
        await self._inner.prepare(sampling, share=batch_share(share))

    def submit(self, *args: Any, share: FairShare | None = None, **kwargs: Any) -> Any:
        return self._inner.submit(*args, share=batch_share(share), **kwargs)


class Abandoned:
    """Request ids of attempts the runner stopped itself: recorded as interrupted (free)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def mark(self, event: UsageEvent) -> UsageEvent:
        status = "interrupted" if event.request_id in self.ids else event.status
        return replace(event, batch=True, status=status)


class BatchRecorder:
    def __init__(self, inner: UsageRecorder, abandoned: Abandoned) -> None:
        self._inner = inner
        self._abandoned = abandoned

    async def record(self, event: UsageEvent) -> bool:
        return await self._inner.record(self._abandoned.mark(event))


class BatchBilling:
    def __init__(self, inner: BillingHooks, abandoned: Abandoned) -> None:
        self._inner = inner
        self._abandoned = abandoned

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def admit(self, admission: Admission) -> None:
        await self._inner.admit(admission)

    async def release(self, admission: Admission) -> None:
        await self._inner.release(admission)

    async def settle(self, event: UsageEvent) -> Decimal | None:
        return await self._inner.settle(self._abandoned.mark(event))

    def allows_ttl(self, *, model: str, ttl_s: int) -> bool:
        return self._inner.allows_ttl(model=model, ttl_s=ttl_s)


class BatchGateway:
    """The Gateway, with its engine, recorder and billing as a batch item's; everything else is the real one's."""

    def __init__(self, gw: Gateway, abandoned: Abandoned) -> None:
        self._gw = gw
        self.engine = BatchEngine(gw.engine)
        self.recorder = BatchRecorder(gw.recorder, abandoned)
        self.billing = BatchBilling(gw.billing, abandoned)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gw, name)
