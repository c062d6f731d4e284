"""Wrong admin tokens slow down whoever sends them: per client address, then a growing lock-out.

Without it /admin/v1 and /login took 200 wrong tokens in 3 s. An address may get
FREE_FAILURES wrong tokens within WINDOW_S; past that it is locked out (429 with
Retry-After, the token not even checked) for 2, 4, 8 ... seconds, up to MAX_LOCKOUT_S,
each further failure doubling it. A right token clears its address. Other addresses are
never slowed, so an attacker cannot lock the real admin out from elsewhere. (Behind a
proxy every client shares the proxy's address: put the admin API on its own listener.)
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.errors import RateLimitError

FREE_FAILURES = 10
WINDOW_S = 60.0
MAX_LOCKOUT_S = 300.0
MAX_ADDRESSES = 10_000  # the oldest are forgotten first: memory stays bounded under a spray


@dataclass
class _Record:
    failures: int
    first_at: float
    locked_until: float = 0.0


class AdminAttempts:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def check(self, address: str) -> None:
        """RateLimitError while `address` is locked out."""
        record = self._records.get(address)
        if record is None:
            return
        left = record.locked_until - self._clock()
        if left > 0:
            raise RateLimitError(
                f"too many wrong admin tokens from this address; try again in {left:.0f} s", retry_after_s=left
            )

    def failed(self, address: str) -> None:
        now = self._clock()
        record = self._records.get(address)
        if record is None or (now - record.first_at > WINDOW_S and record.locked_until <= now):
            record = _Record(failures=0, first_at=now)
        record.failures += 1
        if record.failures > FREE_FAILURES:
            record.locked_until = now + min(MAX_LOCKOUT_S, 2.0 ** (record.failures - FREE_FAILURES))
        self._records[address] = record
        self._records.move_to_end(address)
        while len(self._records) > MAX_ADDRESSES:
            self._records.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._records.pop(address, None)
