"""When each alert fires, on the rules alone: thresholds are met exactly, and minimums keep noise out."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from alerts import rules
from alerts.kinds import BUDGET_80, BUDGET_100, CACHE_DROP, SPEND_ANOMALY
from alerts.urls import check_webhook_url
from billing.money import PICO_PER_USD
from kvgate.errors import InvalidRequestError

HOUR = datetime(2026, 3, 10, 11, tzinfo=UTC)
LIMIT = 100 * PICO_PER_USD


def _budget(spent_pico: int, limit_pico: int = LIMIT) -> rules.BudgetReading:
    return rules.BudgetReading("tenant_month", "ten_1", "tenant", "2026-03", limit_pico, spent_pico)


def test_budget_80_fires_at_80_percent_and_not_one_pico_below() -> None:
    assert rules.budget_alerts([_budget(80 * PICO_PER_USD - 1)]) == []
    (fired,) = rules.budget_alerts([_budget(80 * PICO_PER_USD)])
    assert fired.kind == BUDGET_80 and fired.period == "tenant_month:ten_1:2026-03"
    assert "80% spent: $80.00 of $100.00" in fired.summary
    assert [f.kind for f in rules.budget_alerts([_budget(LIMIT)])] == [BUDGET_80, BUDGET_100]
    assert rules.budget_alerts([_budget(5, limit_pico=0)]) == []  # a zero budget has no way there


def test_the_cache_drop_needs_volume_a_real_baseline_and_a_halving() -> None:
    day = rules.CacheWindow(prompt_tokens=240_000, read_tokens=180_000)  # 75% read
    fallen = rules.CacheWindow(prompt_tokens=10_000, read_tokens=3_000)  # 30%
    (fired,) = rules.cache_drop_alert(hour=fallen, baseline=day, hour_start=HOUR)
    assert fired.kind == CACHE_DROP and fired.period == HOUR.isoformat() and "30%" in fired.summary
    held = rules.CacheWindow(prompt_tokens=10_000, read_tokens=3_750)  # exactly half: not below it
    assert rules.cache_drop_alert(hour=held, baseline=day, hour_start=HOUR) == []
    quiet = rules.CacheWindow(prompt_tokens=9_999, read_tokens=0)  # too few tokens to mean anything
    assert rules.cache_drop_alert(hour=quiet, baseline=day, hour_start=HOUR) == []
    uncached = rules.CacheWindow(prompt_tokens=240_000, read_tokens=40_000)  # under 20% to begin with
    assert rules.cache_drop_alert(hour=rules.CacheWindow(10_000, 0), baseline=uncached, hour_start=HOUR) == []


def test_a_spend_anomaly_is_far_above_the_median_hour_and_above_the_minimum() -> None:
    trailing = [PICO_PER_USD] * 20 + [0] * 4  # the median hour: $1
    (fired,) = rules.spend_anomaly_alert(hour_spend_pico=5 * PICO_PER_USD, trailing_pico=trailing, hour_start=HOUR)
    assert fired.kind == SPEND_ANOMALY and "$5.00" in fired.summary
    assert (
        rules.spend_anomaly_alert(hour_spend_pico=5 * PICO_PER_USD - 1, trailing_pico=trailing, hour_start=HOUR) == []
    )
    # Quiet days have a median of 0: the minimum keeps a few cents from being an anomaly.
    assert rules.spend_anomaly_alert(hour_spend_pico=PICO_PER_USD - 1, trailing_pico=[0] * 24, hour_start=HOUR) == []
    assert rules.spend_anomaly_alert(hour_spend_pico=PICO_PER_USD, trailing_pico=[0] * 24, hour_start=HOUR)


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "file:///etc/passwd",
        "ftp://example.com/x",
        "gopher://127.0.0.1:6379/_FLUSHALL",
        "http://",
        "https://user:pw@example.com/hook",
        "http://example.com/a b",
        "http://example.com/\r\nHost: evil",
        "http://example.com:99999/",
        "//example.com/hook",
        "",
        "https://example.com/" + "a" * 2100,
    ],
)
def test_hostile_webhook_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidRequestError):
        check_webhook_url(url)


def test_plain_webhook_urls_are_accepted() -> None:
    assert check_webhook_url(" https://hooks.example.com/kvgate?x=1 ") == "https://hooks.example.com/kvgate?x=1"
    assert check_webhook_url("http://127.0.0.1:8000/hook", allow_private=True) == "http://127.0.0.1:8000/hook"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/hook",
        "http://localhost/h",
        "http://10.0.0.7/h",
        "http://[::1]/h",
        "http://169.254.169.254/",
    ],
)
def test_webhooks_to_the_operators_network_are_refused_unless_allowed(url: str) -> None:
    with pytest.raises(InvalidRequestError, match="public address"):
        check_webhook_url(url)
    assert check_webhook_url(url, allow_private=True) == url
