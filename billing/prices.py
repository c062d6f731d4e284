"""Price versions: what a model costs from a given moment, and the exact per-token rates.

A catalog entry is USD per million tokens for input and output, plus the cache
multipliers applied to the input price. Entries are versions: a change is a new
version with a later effective_from, never an edit, so a recorded request can
always be re-priced with the version it names.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

from billing.errors import BillingDomainError
from billing.money import PICO_PER_TOKEN_PER_USD_PER_MTOK
from kvgate.usage import TTL_CLASSES, Category, TokenCounts

DEFAULT_PRICE_FILE = Path(__file__).with_name("prices.toml")
FALLBACK_MODEL = "*"
"""A catalog entry for this name prices every model that has none of its own."""

# 5m and 1h are Anthropic's write prices. 30m and 12h (OpenAI's prompt_cache_options and
# prompt_cache_breakpoint TTLs, which OpenAI has not priced separately) follow the curve through
# Anthropic's two points: a write premium of 0.25 x (TTL / 5 min) ** (log 4 / log 12), rounded to
# 0.05, so 30m is 1.7x and 12h 5x (see docs/billing.md, "Cache TTL classes").
DEFAULT_MULTIPLIERS: dict[str, Decimal] = {
    "cache_write_5m_multiplier": Decimal("1.25"),
    "cache_write_1h_multiplier": Decimal("2.0"),
    "cache_read_multiplier": Decimal("0.1"),
    "cache_write_30m_multiplier": Decimal("1.7"),
    "cache_write_12h_multiplier": Decimal("5.0"),
}
# Bounds that keep every cost inside the ledger's 64-bit pico-dollar columns.
MAX_USD_PER_MTOK = Decimal(10_000)
MAX_MULTIPLIER = Decimal(100)
# Batches (gateway/batches) pay this share of every rate, on top of the cache multipliers: Anthropic's and
# OpenAI's batch discount. A catalog (prices.toml) field; not in PRICE_FIELDS, so the admin API and the CLI
# carry it over from the version before (or default it) rather than set it.
DEFAULT_BATCH_MULTIPLIER = Decimal("0.5")
_MULTIPLIER_KEYS = (*DEFAULT_MULTIPLIERS, "cache_write_24h_multiplier", "batch_multiplier")
PRICE_FIELDS = (
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    *(f"{t.category.value}_multiplier" for t in TTL_CLASSES),
    "cache_read_multiplier",
)
"""Everything a version prices: the input and output prices and each cache class's multiplier (TTL order)."""
NULLABLE_FIELDS = frozenset({"cache_write_24h_multiplier"})
"""Set to None, the class is not offered (24h retention is opt-in)."""
_ENTRY_KEYS = {"model", "effective_from", "input_usd_per_mtok", "output_usd_per_mtok", *_MULTIPLIER_KEYS}


class PriceError(BillingDomainError, ValueError):
    """A catalog entry that is malformed or cannot be priced exactly."""


@dataclass(frozen=True)
class Rates:
    """Pico-dollars per token for each category; None where the TTL class is not offered."""

    input: int
    cache_write_5m: int
    cache_write_30m: int
    cache_write_1h: int
    cache_write_12h: int
    cache_write_24h: int | None
    cache_read: int
    output: int

    def for_category(self, category: Category) -> int:
        rate = getattr(self, category.value)
        if rate is None:
            raise PriceError(f"{category.value} is not offered by this price version")
        return rate


@dataclass(frozen=True, kw_only=True)
class PriceSpec:
    model: str
    effective_from: datetime
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    cache_write_5m_multiplier: Decimal = DEFAULT_MULTIPLIERS["cache_write_5m_multiplier"]
    cache_write_1h_multiplier: Decimal = DEFAULT_MULTIPLIERS["cache_write_1h_multiplier"]
    cache_read_multiplier: Decimal = DEFAULT_MULTIPLIERS["cache_read_multiplier"]
    cache_write_30m_multiplier: Decimal = DEFAULT_MULTIPLIERS["cache_write_30m_multiplier"]
    cache_write_12h_multiplier: Decimal = DEFAULT_MULTIPLIERS["cache_write_12h_multiplier"]
    cache_write_24h_multiplier: Decimal | None = None
    batch_multiplier: Decimal = DEFAULT_BATCH_MULTIPLIER
    rates: Rates = field(init=False, repr=False, compare=False)
    batch_rates: Rates = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.model or len(self.model) > 200:
            raise PriceError("model must be a non-empty name of at most 200 characters")
        if self.effective_from.tzinfo is None:
            raise PriceError(f"{self.model}: effective_from must carry a time zone (use UTC)")
        object.__setattr__(self, "effective_from", self.effective_from.astimezone(UTC))
        for name in PRICE_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
                raise PriceError(f"{self.model}: {name} must be a non-negative decimal, got {value!r}")
            if value > (MAX_MULTIPLIER if name.endswith("multiplier") else MAX_USD_PER_MTOK):
                raise PriceError(f"{self.model}: {name} = {value} is beyond any plausible price")
        batch = self.batch_multiplier
        if not isinstance(batch, Decimal) or not batch.is_finite() or not 0 < batch <= 1:
            raise PriceError(f"{self.model}: batch_multiplier must be a decimal in (0, 1], got {batch!r}")
        object.__setattr__(self, "rates", self._rates(Decimal(1)))
        object.__setattr__(self, "batch_rates", self._rates(batch))

    def _rates(self, scale: Decimal) -> Rates:
        """Every category's rate times `scale` (1, or the batch multiplier), in whole pico-dollars per token.

        An interactive rate finer than that is a PriceError. A batch rate is the interactive one times
        the multiplier, rounded half-even to the pico-dollar per token where it is finer (a 4-decimal
        price times 1.25 times 0.5 can be 62.5 pico-dollars): the batch price is then that rate, exactly,
        at most half a pico-dollar per token from the exact share; prices.toml's are all exact.
        """
        p_in, p_out = self.input_usd_per_mtok * scale, self.output_usd_per_mtok * scale
        m24 = self.cache_write_24h_multiplier
        what = "" if scale == 1 else "batch "
        rate = _rate if scale == 1 else _rounded_rate
        return Rates(
            input=rate(self.model, f"{what}input", p_in),
            cache_write_5m=rate(self.model, f"{what}cache write 5m", p_in * self.cache_write_5m_multiplier),
            cache_write_30m=rate(self.model, f"{what}cache write 30m", p_in * self.cache_write_30m_multiplier),
            cache_write_1h=rate(self.model, f"{what}cache write 1h", p_in * self.cache_write_1h_multiplier),
            cache_write_12h=rate(self.model, f"{what}cache write 12h", p_in * self.cache_write_12h_multiplier),
            cache_write_24h=None if m24 is None else rate(self.model, f"{what}cache write 24h", p_in * m24),
            cache_read=rate(self.model, f"{what}cache read", p_in * self.cache_read_multiplier),
            output=rate(self.model, f"{what}output", p_out),
        )

    @property
    def ttl_classes(self) -> tuple[str, ...]:
        """The cache TTL classes a request may ask for under this version."""
        return tuple(t.name for t in TTL_CLASSES if getattr(self.rates, t.category.value) is not None)

    def unit_price_per_mtok(self, category: Category) -> Decimal:
        """USD per million tokens of a category, as printed on invoices."""
        return Decimal(self.rates.for_category(category)).scaleb(-6).normalize()

    def same_prices(self, other: PriceSpec) -> bool:
        return all(getattr(self, n) == getattr(other, n) for n in ("model", *PRICE_FIELDS, "batch_multiplier"))

    def rates_for(self, *, batch: bool = False) -> Rates:
        """The interactive rates, or a batch request's (each rate times batch_multiplier, exactly)."""
        return self.batch_rates if batch else self.rates

    def cost_pico(self, counts: TokenCounts, *, batch: bool = False) -> int:
        """Exact cost in pico-dollars: the issue's formula with each multiplier folded into a rate."""
        rates = self.rates_for(batch=batch)
        total = 0
        for category, tokens in counts.by_category().items():
            if tokens:
                total += tokens * rates.for_category(category)
        return total

    def uncached_cost_pico(self, counts: TokenCounts, *, batch: bool = False) -> int:
        """What the same request would cost with no prompt cache: every prompt token as input."""
        rates = self.rates_for(batch=batch)
        return counts.prompt_tokens * rates.input + counts.output * rates.output

    def read_savings_pico(self, counts: TokenCounts, *, batch: bool = False) -> int:
        """What the request's cache reads saved: those tokens at the input rate, less their read rate
        (the dashboard's read savings). Never negative: a catalog pricing reads above input saves nothing."""
        rates = self.rates_for(batch=batch)
        return max(0, counts.cache_read * (rates.input - rates.cache_read))


@dataclass(frozen=True, kw_only=True)
class PriceVersion(PriceSpec):
    """A catalog entry as stored, with the id ledger entries refer to."""

    id: int


@dataclass(frozen=True)
class PriceChange:
    """A new version as asked for: only the fields given (PRICE_FIELDS names).

    What it leaves out comes from the version before it (the model's version in force at
    effective_from), so a change of the input price keeps, say, the 24h class the model had;
    a model's first version takes the default multipliers instead, and needs both prices.
    """

    model: str
    effective_from: datetime
    given: Mapping[str, Decimal | None]

    def __post_init__(self) -> None:
        unknown = set(self.given) - set(PRICE_FIELDS)
        if unknown:
            raise PriceError(f"{self.model}: unknown price fields {sorted(unknown)}")
        for name, value in self.given.items():
            if value is None and name not in NULLABLE_FIELDS:
                raise PriceError(f"{self.model}: {name} cannot be null")

    def resolve(self, previous: PriceSpec | None) -> ResolvedPrice:
        """The full version: the given fields, the rest carried over from `previous` (or defaulted)."""
        values: dict[str, Decimal | None] = dict(self.given)
        carried: list[str] = []
        for name in PRICE_FIELDS:
            if name in values:
                continue
            if previous is not None:
                values[name] = getattr(previous, name)
                carried.append(name)
            elif name in DEFAULT_MULTIPLIERS:
                values[name] = DEFAULT_MULTIPLIERS[name]
            elif name not in NULLABLE_FIELDS:
                raise PriceError(f"{self.model} has no earlier version to carry {name} over from; give it")
        batch = previous.batch_multiplier if previous is not None else DEFAULT_BATCH_MULTIPLIER
        spec = PriceSpec(model=self.model, effective_from=self.effective_from, batch_multiplier=batch, **values)  # type: ignore[arg-type]
        return ResolvedPrice(spec=spec, carried_over=tuple(carried))


@dataclass(frozen=True)
class ResolvedPrice:
    spec: PriceSpec
    carried_over: tuple[str, ...]
    """The PRICE_FIELDS taken from the previous version, in PRICE_FIELDS order."""


def _rate(model: str, what: str, usd_per_mtok: Decimal) -> int:
    pico = usd_per_mtok * PICO_PER_TOKEN_PER_USD_PER_MTOK
    if pico != pico.to_integral_value():
        raise PriceError(
            f"{model}: the {what} rate {usd_per_mtok} USD/Mtok is finer than a pico-dollar per token; "
            "use at most 4 decimals for prices and multiples of 0.05 for multipliers"
        )
    return int(pico)


def _rounded_rate(model: str, what: str, usd_per_mtok: Decimal) -> int:
    """A derived (batch) rate in whole pico-dollars per token, rounded half-even where it is finer."""
    return int((usd_per_mtok * PICO_PER_TOKEN_PER_USD_PER_MTOK).to_integral_value(rounding=ROUND_HALF_EVEN))


def parse_price_entries(data: dict[str, Any], *, source: str = "prices") -> list[PriceSpec]:
    """Turn a parsed price file (see billing/prices.toml) into validated specs."""
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict) or set(defaults) - set(_MULTIPLIER_KEYS):
        raise PriceError(f"{source}: [defaults] may only set {', '.join(_MULTIPLIER_KEYS)}")
    entries = data.get("prices")
    if not isinstance(entries, list) or not entries:
        raise PriceError(f"{source}: expected one or more [[prices]] tables")
    specs: list[PriceSpec] = []
    seen: set[tuple[str, datetime]] = set()
    for index, entry in enumerate(entries):
        where = f"{source}: [[prices]] #{index + 1}"
        if not isinstance(entry, dict):
            raise PriceError(f"{where}: not a table")
        unknown = set(entry) - _ENTRY_KEYS
        if unknown:
            raise PriceError(f"{where}: unknown keys {sorted(unknown)}")
        missing = {"model", "effective_from", "input_usd_per_mtok", "output_usd_per_mtok"} - set(entry)
        if missing:
            raise PriceError(f"{where}: missing {sorted(missing)}")
        values = {**DEFAULT_MULTIPLIERS, **defaults, **entry}
        values["effective_from"] = _as_utc(values["effective_from"], where)
        for key in ("input_usd_per_mtok", "output_usd_per_mtok", *_MULTIPLIER_KEYS):
            if key in values:
                values[key] = _as_decimal(values[key], f"{where}: {key}")
        spec = PriceSpec(**values)
        if (spec.model, spec.effective_from) in seen:
            raise PriceError(f"{where}: {spec.model} has two entries effective from {spec.effective_from}")
        seen.add((spec.model, spec.effective_from))
        specs.append(spec)
    return specs


def load_price_file(path: Path = DEFAULT_PRICE_FILE) -> list[PriceSpec]:
    try:
        with path.open("rb") as fh:
            # parse_float keeps TOML numbers like 0.15 exact instead of binary floats.
            data = tomllib.load(fh, parse_float=Decimal)
    except tomllib.TOMLDecodeError as exc:
        raise PriceError(f"{path}: {exc}") from exc
    return parse_price_entries(data, source=str(path))


def _as_decimal(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | str | Decimal):
        raise PriceError(f"{where} must be a number or a decimal string")
    try:
        return Decimal(value)
    except ArithmeticError as exc:
        raise PriceError(f"{where} is not a decimal: {value!r}") from exc


def _as_utc(value: Any, where: str) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise PriceError(f"{where}: effective_from needs an offset, e.g. 2026-01-01T00:00:00Z")
        return value.astimezone(UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    raise PriceError(f"{where}: effective_from must be a TOML date or offset date-time")
