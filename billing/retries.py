"""Running a settlement transaction again when it lost a race (a deadlock, a serialization failure,
SQLite's busy write lock), a bounded number of times with jittered back-off.

The whole transaction is the unit: PostgreSQL has already rolled the loser back, and every
settlement write is idempotent by request id, so running it again cannot count anything twice.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from kvgate.db_health import is_transaction_conflict

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Attempts in all (the first plus retries), and the back-off before retry n: a random wait in
# [0, base * 2**n], capped. Full jitter spreads the losers of one deadlock apart, so they do not
# meet again on the next attempt.
CONFLICT_ATTEMPTS = 4
CONFLICT_BASE_DELAY_S = 0.02
CONFLICT_MAX_DELAY_S = 0.5


async def retry_conflicts(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: str,
    attempts: int = CONFLICT_ATTEMPTS,
    base_delay_s: float = CONFLICT_BASE_DELAY_S,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """`attempt()` (one whole transaction), again after a transaction conflict; the last conflict
    propagates once `attempts` are used up. Any other error propagates at once."""
    for n in range(attempts):
        try:
            return await attempt()
        except Exception as error:
            if not is_transaction_conflict(error) or n + 1 == attempts:
                raise
            if on_retry is not None:
                on_retry(error)
            log.debug("billing.transaction_conflict_retry", what=what, attempt=n + 1, error=str(error)[:200])
            await asyncio.sleep(random.uniform(0, min(CONFLICT_MAX_DELAY_S, base_delay_s * 2**n)))
    raise AssertionError("unreachable")
