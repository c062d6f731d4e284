"""The runner's seams: the batch share the engine sees, and the batch flag (and free stopped attempts) on the
usage events the interactive bookkeeping writes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gateway.batches.wrappers import BATCH_WEIGHT, Abandoned, BatchEngine, BatchRecorder
from inference.types import FairShare
from kvgate.usage import TokenCounts, UsageEvent


class FakeEngine:
    def __init__(self) -> None:
        self.shares: list[FairShare | None] = []
        self.model_id = "m"

    async def prepare(self, sampling: Any, *, share: FairShare | None = None) -> None:
        self.shares.append(share)

    def submit(self, *args: Any, share: FairShare | None = None, **kwargs: Any) -> str:
        self.shares.append(share)
        return "handle"


async def test_batch_items_queue_under_the_tenants_batch_share() -> None:
    inner = FakeEngine()
    engine = BatchEngine(inner)
    await engine.prepare(None, share=FairShare("ten_a", 40))
    assert engine.submit([1, 2], None, None, request_id="r", share=FairShare("ten_a", 40)) == "handle"
    assert inner.shares == [FairShare("ten_a:batch", BATCH_WEIGHT)] * 2
    assert BATCH_WEIGHT == 1 and engine.model_id == "m"  # the rest is the engine's own


class ListRecorder:
    def __init__(self) -> None:
        self.events: list[UsageEvent] = []

    async def record(self, event: UsageEvent) -> bool:
        self.events.append(event)
        return True


async def test_events_are_flagged_and_stopped_attempts_are_interrupted() -> None:
    inner, abandoned = ListRecorder(), Abandoned()
    recorder = BatchRecorder(inner, abandoned)
    event = UsageEvent(
        request_id="b_0_1",
        tenant_id="t",
        api_key_id="k",
        model="m",
        endpoint="messages",
        started_at=datetime.now(UTC),
        counts=TokenCounts(input=3, output=2),
        ttft_ms=1,
        latency_ms=2,
        status="cancelled",
    )
    await recorder.record(event)
    abandoned.ids.add("b_0_1")
    await recorder.record(event)
    assert [(e.batch, e.status) for e in inner.events] == [(True, "cancelled"), (True, "interrupted")]
    assert inner.events[0].as_row()["batch"] is True
