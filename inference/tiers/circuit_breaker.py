"""A circuit breaker for a remote store: after a failure, stop calling it for a while, backing off.

A remote KV tier that is down must cost a request nothing but the recompute. Without a
breaker every lookup would wait out a connect timeout; with it, the first failure opens
the breaker and calls are skipped (misses) until the backoff has passed. Then one call
is let through (half-open): success closes the breaker, failure reopens it for twice as
long, up to max_backoff_s. Time is the monotonic wall clock: this is about the network,
not about the engine's (possibly manual) cache clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    def __init__(
        self,
        *,
        base_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        assert 0 < base_backoff_s <= max_backoff_s
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._backoff_s = 0.0  # 0: closed
        self._retry_at = 0.0
        self._probing = False
        self.num_opened = 0  # times it went from closed to open

    @property
    def backoff_s(self) -> float:
        """How long calls are skipped after the latest failure (0 when closed)."""
        return self._backoff_s

    @property
    def is_open(self) -> bool:
        """Whether calls are being skipped now (a probe may be under way)."""
        with self._lock:
            return self._backoff_s > 0 and (self._probing or self._monotonic() < self._retry_at)

    def allow(self) -> bool:
        """Whether to make a call now: closed, or open with its backoff over (this caller then probes)."""
        with self._lock:
            if self._backoff_s == 0:
                return True
            if self._probing or self._monotonic() < self._retry_at:
                return False
            self._probing = True
            return True

    def success(self) -> None:
        with self._lock:
            self._backoff_s = 0.0
            self._probing = False

    def failure(self) -> None:
        with self._lock:
            if self._backoff_s == 0:
                self.num_opened += 1
                self._backoff_s = self.base_backoff_s
            elif self._probing:
                self._backoff_s = min(self._backoff_s * 2, self.max_backoff_s)
            self._probing = False
            self._retry_at = self._monotonic() + self._backoff_s
