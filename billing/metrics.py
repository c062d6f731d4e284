"""Billing's Prometheus metrics: the spool, fail-open admissions, repeated usage, spend and cache savings.

Each BillingService has its own BillingMetrics, a prometheus_client collector registered
nowhere by itself: the gateway registers it in its app's registry (it reaches it as the
billing hooks' `metrics`, see gateway.billing_hooks), so /metrics serves it and two services
in one process never share a count.

Spend and savings are counted when a usage entry is written to the ledger (live, or when a
spooled settlement is replayed), from the same integer pico-dollar amounts the entry holds,
and shown in USD. A repeat of an entry already there (a retry, a replay, a crash recovery) is
counted as a duplicate and adds no spend. Reversals are not subtracted: counters only rise.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter
from prometheus_client.metrics_core import Metric

from billing.ledger import UsageCharge
from billing.money import PICO_PER_USD
from billing.prices import PriceSpec
from billing.settlement import Settlement

REPLAY_OUTCOMES = ("applied", "duplicate", "rejected")


class BillingMetrics:
    """Billing's counters; `tenant_label=False` drops the tenant label of spend and savings (one
    series each instead of one per tenant, for deployments with many tenants)."""

    def __init__(self, *, tenant_label: bool = True) -> None:
        self.tenant_label = tenant_label
        self.spooled = Counter(
            "kvgate_billing_spooled",
            "Settlements written to the local spool (database unavailable, too slow, or a lost race).",
            registry=None,
        )
        self.replayed = Counter(
            "kvgate_billing_replayed",
            "Spooled settlements replayed into the ledger, by outcome (applied, duplicate, rejected).",
            ["outcome"],
            registry=None,
        )
        self.conflicts = Counter(
            "kvgate_billing_settlement_conflicts",
            "Live settlements that lost a transaction race (deadlock, serialization failure, SQLite lock), by "
            "outcome: retried (run again), spooled (still losing after the retries: replayed from the spool).",
            ["outcome"],
            registry=None,
        )
        for outcome in ("retried", "spooled"):  # both series from the start, at 0
            self.conflicts.labels(outcome)
        self.fail_open = Counter(
            "kvgate_billing_admit_fail_open",
            "Requests admitted from the in-memory budgets (database unavailable).",
            registry=None,
        )
        self.duplicates = Counter(
            "kvgate_billing_duplicate_usage",
            "Usage settlements whose request id was already in the ledger (counted once, not charged again).",
            registry=None,
        )
        labels = ["tenant"] if tenant_label else []
        self._spend = Counter(
            "kvgate_spend_usd", "USD charged for usage, as written to the ledger.", labels, registry=None
        )
        self._savings = Counter(
            "kvgate_cache_savings_usd",
            "USD saved by cache reads: read tokens at the input price, less what they were charged.",
            labels,
            registry=None,
        )
        for outcome in REPLAY_OUTCOMES:  # every series from the start, at 0
            self.replayed.labels(outcome)

    def settled(self, charge: UsageCharge, price: PriceSpec, settlement: Settlement) -> None:
        """One committed usage settlement of `charge` at `price`: a new ledger entry, or a repeat of one."""
        if not settlement.inserted:
            self.duplicates.inc()
            return
        spend, savings = self._spend, self._savings
        if self.tenant_label:
            spend, savings = spend.labels(charge.tenant_id), savings.labels(charge.tenant_id)
        # Floats only here, at the edge: the amounts themselves are exact integers (the entry's cost).
        spend.inc(settlement.cost_pico / PICO_PER_USD)
        savings.inc(price.read_savings_pico(charge.counts, batch=charge.batch) / PICO_PER_USD)

    def collect(self) -> Iterable[Metric]:
        counters = (
            self.spooled,
            self.replayed,
            self.conflicts,
            self.fail_open,
            self.duplicates,
            self._spend,
            self._savings,
        )
        for counter in counters:
            yield from counter.collect()
