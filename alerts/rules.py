"""When each alert fires, as pure functions of what the readings found (alerts/readings.py).

Each returns the alerts due now, each with the period it fires once for; the store dedupes on
(tenant, kind, period), so calling these every minute fires each alert once. Integer arithmetic
throughout: money in pico-dollars, shares compared by cross-multiplying.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from statistics import median_low

from alerts.kinds import BUDGET_80, BUDGET_100, CACHE_DROP, REFUSALS, SPEND_ANOMALY
from billing.money import PICO_PER_CENT, PICO_PER_USD, format_usd

BUDGET_THRESHOLDS = ((BUDGET_80, 80), (BUDGET_100, 100))
# An hour needs at least this many refusals to alert (one is already news: a budget or limit was hit).
MIN_REFUSALS = 1
# The cache hit-rate drop needs this many prompt tokens in the hour and in the day before it, so a handful of
# requests cannot fire it; the day's share must be at least 1/5 to drop from, and the hour below half of it.
MIN_CACHE_PROMPT_TOKENS = 10_000
MIN_BASELINE_SHARE = (1, 5)
DROP_FACTOR = 2
# A spend anomaly: an hour at least ANOMALY_FACTOR times the median hour of the 24 before it, and at least
# MIN_ANOMALY_SPEND_PICO (a median of zero hours would make any spend an anomaly).
ANOMALY_FACTOR = 5
MIN_ANOMALY_SPEND_PICO = PICO_PER_USD
TRAILING_HOURS = 24


@dataclass(frozen=True)
class Fired:
    kind: str
    period: str
    summary: str
    data: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class BudgetReading:
    """One monthly budget: the tenant's ("tenant_month") or a key's ("key_month")."""

    scope: str
    owner_id: str
    owner_name: str
    month: str
    limit_pico: int
    spent_pico: int


@dataclass(frozen=True)
class CacheWindow:
    prompt_tokens: int
    read_tokens: int


def _usd(pico: int) -> str:
    return format_usd(pico // PICO_PER_CENT)


def budget_alerts(readings: Iterable[BudgetReading]) -> list[Fired]:
    fired = []
    for reading in readings:
        if reading.limit_pico <= 0:  # a zero budget refuses everything: nothing to warn about on the way
            continue
        for kind, percent in BUDGET_THRESHOLDS:
            if reading.spent_pico * 100 >= reading.limit_pico * percent:
                what = "The monthly budget" if reading.scope == "tenant_month" else f"Key {reading.owner_name}'s budget"
                fired.append(
                    Fired(
                        kind=kind,
                        period=f"{reading.scope}:{reading.owner_id}:{reading.month}",
                        summary=f"{what} for {reading.month} is {percent}% spent: "
                        f"{_usd(reading.spent_pico)} of {_usd(reading.limit_pico)}",
                        data={
                            "scope": reading.scope,
                            "owner_id": reading.owner_id,
                            "month": reading.month,
                            "threshold_percent": percent,
                            "limit_pico": reading.limit_pico,
                            "spent_pico": reading.spent_pico,
                        },
                    )
                )
    return fired


def refusal_alert(*, refusals: int, hour: datetime) -> list[Fired]:
    if refusals < MIN_REFUSALS:
        return []
    return [
        Fired(
            kind=REFUSALS,
            period=hour.isoformat(),
            summary=f"{refusals} request(s) refused since {hour:%Y-%m-%d %H:%M} UTC (budget or rate limit)",
            data={"hour": hour.isoformat(), "refused": refusals},
        )
    ]


def cache_drop_alert(*, hour: CacheWindow, baseline: CacheWindow, hour_start: datetime) -> list[Fired]:
    if min(hour.prompt_tokens, baseline.prompt_tokens) < MIN_CACHE_PROMPT_TOKENS:
        return []
    num, den = MIN_BASELINE_SHARE
    if baseline.read_tokens * den < baseline.prompt_tokens * num:
        return []
    # hour share < baseline share / DROP_FACTOR, cross-multiplied
    if hour.read_tokens * baseline.prompt_tokens * DROP_FACTOR >= baseline.read_tokens * hour.prompt_tokens:
        return []
    hour_pct = 100 * hour.read_tokens // hour.prompt_tokens
    base_pct = 100 * baseline.read_tokens // baseline.prompt_tokens
    return [
        Fired(
            kind=CACHE_DROP,
            period=hour_start.isoformat(),
            summary=f"Cache hit rate fell to {hour_pct}% of prompt tokens in the hour from "
            f"{hour_start:%Y-%m-%d %H:%M} UTC, from {base_pct}% over the day before",
            data={
                "hour": hour_start.isoformat(),
                "hour_prompt_tokens": hour.prompt_tokens,
                "hour_read_tokens": hour.read_tokens,
                "baseline_prompt_tokens": baseline.prompt_tokens,
                "baseline_read_tokens": baseline.read_tokens,
            },
        )
    ]


def spend_anomaly_alert(*, hour_spend_pico: int, trailing_pico: Sequence[int], hour_start: datetime) -> list[Fired]:
    median = median_low(trailing_pico) if trailing_pico else 0
    if hour_spend_pico < MIN_ANOMALY_SPEND_PICO or hour_spend_pico < ANOMALY_FACTOR * median:
        return []
    return [
        Fired(
            kind=SPEND_ANOMALY,
            period=hour_start.isoformat(),
            summary=f"Spend of {_usd(hour_spend_pico)} in the hour from {hour_start:%Y-%m-%d %H:%M} UTC, "
            f"against a median hour of {_usd(median)} over the day before",
            data={"hour": hour_start.isoformat(), "spend_pico": hour_spend_pico, "median_hour_pico": median},
        )
    ]
