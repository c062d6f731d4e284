"""One engine of a pool as the pool sees it: its load, whether it may get traffic, when to probe it next."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.backends.http import HttpEngine
from gateway.routing.types import EngineLoad


@dataclass(frozen=True)
class HealthPolicy:
    """How often engines are probed: every interval_s while healthy; when not, after backoff_min_s,
    doubling per failed probe up to backoff_max_s."""

    interval_s: float = 2.0
    backoff_min_s: float = 0.25
    backoff_max_s: float = 30.0

    def delay_after_failures(self, failures: int) -> float:
        """The wait before the next probe of an engine that failed its last `failures` probes (>= 1)."""
        return min(self.backoff_max_s, self.backoff_min_s * 2 ** min(failures - 1, 30))


@dataclass
class Member:
    """An engine of the pool. It gets traffic only while known (described once) and healthy."""

    engine: HttpEngine
    weight: float
    known: bool = False  # describe() has answered with our model
    healthy: bool = False
    failures: int = 0  # consecutive failed probes (or failed requests' connections)
    next_probe_at: float = 0.0
    reason: str = "not probed yet"  # why it is not healthy, for the error and the log
    active: int = 0
    queued_prefill_tokens: int = 0
    mismatched: bool = field(default=False)  # serves another model: never gets traffic

    @property
    def url(self) -> str:
        return self.engine.base_url.rstrip("/")

    @property
    def engine_id(self) -> str:
        return self.engine.engine_id

    @property
    def routable(self) -> bool:
        return self.known and self.healthy and not self.mismatched

    def load(self) -> EngineLoad:
        return EngineLoad(active=self.active, queued_prefill_tokens=self.queued_prefill_tokens, healthy=self.routable)

    def succeeded(self, now: float, policy: HealthPolicy) -> bool:
        """A probe answered; True if the engine was not healthy before."""
        came_back = not self.healthy
        self.healthy, self.failures, self.reason = True, 0, ""
        self.next_probe_at = now + policy.interval_s
        return came_back

    def failed(self, reason: str, now: float, policy: HealthPolicy) -> bool:
        """A probe or a request's connection failed; True if the engine was healthy before."""
        went_down = self.healthy
        self.healthy = False
        self.failures += 1
        self.reason = reason
        self.next_probe_at = now + policy.delay_after_failures(self.failures)
        return went_down
