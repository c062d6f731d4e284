"""The alert kinds a tenant can turn on, and what each one means (the dashboard and the docs show these)."""

from __future__ import annotations

BUDGET_80 = "budget_80"
BUDGET_100 = "budget_100"
REFUSALS = "refusals"
CACHE_DROP = "cache_hit_drop"
SPEND_ANOMALY = "spend_anomaly"

KIND_HELP = {
    BUDGET_80: "spend reached 80% of the tenant's or a key's monthly budget (once per budget and month)",
    BUDGET_100: "spend reached 100% of the tenant's or a key's monthly budget (once per budget and month)",
    REFUSALS: "requests were refused for a budget or rate limit (once per hour with refusals)",
    CACHE_DROP: "the share of prompt tokens read from the cache in the last hour fell below half of the "
    "previous day's (once per hour)",
    SPEND_ANOMALY: "an hour's spend was far above the median hour of the previous day (once per hour)",
}
KINDS = tuple(KIND_HELP)


def parse_kinds(text: str) -> tuple[str, ...]:
    """The known kinds in a stored space-separated list, in KINDS order (an unknown name is dropped)."""
    chosen = set(text.split())
    return tuple(kind for kind in KINDS if kind in chosen)
