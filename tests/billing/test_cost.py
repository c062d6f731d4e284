"""The cost formula, checked against hand-computed Decimal results."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from billing.money import (
    MoneyError,
    format_usd,
    format_usd_exact,
    pico_to_usd,
    round_to_cents,
    usd_to_cents,
    usd_to_pico,
)
from billing.pricebook import NoPriceError, PriceBook
from billing.prices import PriceError, PriceSpec, PriceVersion, load_price_file, parse_price_entries
from kvgate.usage import Category, TokenCounts

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def spec(p_in: str, p_out: str, **kw) -> PriceSpec:
    return PriceSpec(
        model="m", effective_from=T0, input_usd_per_mtok=Decimal(p_in), output_usd_per_mtok=Decimal(p_out), **kw
    )


def formula(p_in: Decimal, p_out: Decimal, c: TokenCounts) -> Decimal:
    """The issue's formula, written out independently with Decimal."""
    equiv = (
        c.input
        + Decimal("1.25") * c.cache_write_5m
        + Decimal("1.7") * c.cache_write_30m
        + 2 * c.cache_write_1h
        + 5 * c.cache_write_12h
        + Decimal("0.1") * c.cache_read
    )
    return (p_in * equiv + p_out * c.output) / Decimal(1_000_000)


def test_seed_example_twenty_turn_chat_is_81_percent_off():
    # 20 turns writing 11,700 tokens in all and reading 146,300: priced at 1 USD/Mtok input,
    # the cost in USD * 1e6 is the number of input-token-equivalents.
    price = spec("1", "0")
    cached = TokenCounts(cache_write_5m=11_700, cache_read=146_300)
    assert price.cost_pico(cached) == 29_255 * 10**6
    assert price.uncached_cost_pico(cached) == 158_000 * 10**6
    saving = 1 - Decimal(price.cost_pico(cached)) / price.uncached_cost_pico(cached)
    assert saving.quantize(Decimal("0.01")) == Decimal("0.81")
    # A request with no cache activity is not discounted at all.
    plain = TokenCounts(input=158_000)
    assert price.cost_pico(plain) == price.uncached_cost_pico(plain) == 158_000 * 10**6


def test_hand_computed_request_cost():
    # Sonnet-like prices: $3/Mtok in, $15/Mtok out.
    price = spec("3", "15")
    counts = TokenCounts(input=21, cache_write_5m=1808, cache_write_1h=1000, cache_read=5000, output=12)
    # 21*3 + 1808*3.75 + 1000*6 + 5000*0.3 + 12*15 = 63 + 6780 + 6000 + 1500 + 180 = 14523 µ$
    assert pico_to_usd(price.cost_pico(counts)) == Decimal("0.014523")
    assert pico_to_usd(price.cost_pico(counts)) == formula(Decimal(3), Decimal(15), counts)


def test_fractional_prices_stay_exact():
    # $0.15/Mtok: a 5m write is 0.1875 µ$ per token, a read 0.015 µ$: not whole nano-dollars.
    price = spec("0.15", "0.6")
    counts = TokenCounts(input=1, cache_write_5m=1, cache_read=1, output=1)
    assert pico_to_usd(price.cost_pico(counts)) == Decimal("0.00000095250")
    assert price.rates.cache_write_5m == 187_500


@given(
    p_in=st.decimals(min_value=0, max_value=100, places=4),
    p_out=st.decimals(min_value=0, max_value=100, places=4),
    counts=st.builds(
        TokenCounts,
        input=st.integers(0, 10**7),
        cache_write_5m=st.integers(0, 10**7),
        cache_write_30m=st.integers(0, 10**7),
        cache_write_1h=st.integers(0, 10**7),
        cache_write_12h=st.integers(0, 10**7),
        cache_read=st.integers(0, 10**7),
        output=st.integers(0, 10**6),
    ),
)
def test_cost_equals_formula_for_any_four_decimal_price(p_in, p_out, counts):
    price = spec(str(p_in), str(p_out))
    assert pico_to_usd(price.cost_pico(counts)) == formula(p_in, p_out, counts)
    assert price.cost_pico(counts) <= price.uncached_cost_pico(counts) or counts.cache_writes > 0


def test_24h_class_only_where_offered():
    plain = spec("1", "1")
    with pytest.raises(PriceError, match="not offered"):
        plain.cost_pico(TokenCounts(cache_write_24h=1))
    offered = spec("1", "1", cache_write_24h_multiplier=Decimal("1.5"))
    assert offered.cost_pico(TokenCounts(cache_write_24h=2)) == 3_000_000
    assert offered.ttl_classes == ("5m", "30m", "1h", "12h", "24h")
    assert plain.ttl_classes == ("5m", "30m", "1h", "12h")


def test_30m_and_12h_classes_have_their_own_rates():
    # OpenAI's prompt_cache_options / prompt_cache_breakpoint TTLs: 1.7x and 5x the input price.
    price = spec("1", "1")
    assert price.rates.cache_write_30m == 1_700_000 and price.rates.cache_write_12h == 5_000_000
    counts = TokenCounts(input=10, cache_write_30m=100, cache_write_12h=1000, cache_read=50)
    # 10 + 170 + 5000 + 5 = 5185 input-token-equivalents at 1 USD/Mtok
    assert pico_to_usd(price.cost_pico(counts)) == Decimal("0.005185")
    assert price.unit_price_per_mtok(Category.CACHE_WRITE_12H) == Decimal(5)
    # A catalog entry may set its own multipliers; the category follows them.
    custom = spec("1", "1", cache_write_12h_multiplier=Decimal("3"))
    assert custom.cost_pico(TokenCounts(cache_write_12h=2)) == 6_000_000


def test_inexact_prices_are_refused_not_rounded():
    with pytest.raises(PriceError, match="finer than a pico-dollar"):
        spec("0.00001", "1")
    with pytest.raises(PriceError, match="finer than a pico-dollar"):
        spec("0.0001", "1", cache_read_multiplier=Decimal("0.015"))
    assert spec("0.0001", "1").rates.cache_read == 10  # the finest allowed price still works
    with pytest.raises(PriceError, match="non-negative"):
        spec("-1", "1")
    with pytest.raises(PriceError, match="time zone"):
        PriceSpec(
            model="m",
            effective_from=datetime(2026, 1, 1),
            input_usd_per_mtok=Decimal(1),
            output_usd_per_mtok=Decimal(1),
        )


def test_rounding_is_half_even_to_the_cent():
    half_cent = 5 * 10**9
    assert round_to_cents(half_cent) == 0  # 0.5 -> 0
    assert round_to_cents(3 * half_cent) == 2  # 1.5 -> 2
    assert round_to_cents(5 * half_cent) == 2  # 2.5 -> 2
    assert round_to_cents(half_cent + 1) == 1  # just above half
    assert round_to_cents(-3 * half_cent) == -2
    assert format_usd(123456) == "$1,234.56" and format_usd(-50) == "-$0.50"


def test_money_parsing():
    assert usd_to_pico("0.000000000001") == 1
    assert usd_to_cents("12.34") == 1234
    assert format_usd_exact(1_500_000) == "0.0000015" and format_usd_exact(0) == "0"
    for bad in ("0.0000000000001", "abc", "NaN", "Infinity"):
        with pytest.raises(MoneyError):
            usd_to_pico(bad)
    with pytest.raises(MoneyError):
        usd_to_cents("0.001")


def test_seed_file_parses_and_has_a_fallback():
    specs = load_price_file()
    assert any(s.model == "*" for s in specs)


def test_price_file_errors_are_clear():
    base = {"model": "m", "effective_from": T0, "input_usd_per_mtok": 1, "output_usd_per_mtok": 2}
    assert parse_price_entries({"prices": [base]})[0].output_usd_per_mtok == 2
    with pytest.raises(PriceError, match="unknown keys"):
        parse_price_entries({"prices": [{**base, "colour": 1}]})
    with pytest.raises(PriceError, match="missing"):
        parse_price_entries({"prices": [{"model": "m"}]})
    with pytest.raises(PriceError, match="two entries"):
        parse_price_entries({"prices": [base, base]})
    with pytest.raises(PriceError, match="number or a decimal string"):
        parse_price_entries({"prices": [{**base, "input_usd_per_mtok": 1.5}]})  # a binary float
    with pytest.raises(PriceError, match="needs an offset"):
        parse_price_entries({"prices": [{**base, "effective_from": datetime(2026, 1, 1)}]})


def test_pricebook_picks_the_version_in_force_at_request_start():
    def v(id_, model, month, p_in):
        return PriceVersion(
            id=id_,
            model=model,
            effective_from=datetime(2026, month, 1, tzinfo=UTC),
            input_usd_per_mtok=Decimal(p_in),
            output_usd_per_mtok=Decimal(1),
        )

    book = PriceBook([v(1, "a", 1, "1"), v(2, "a", 3, "2"), v(3, "*", 2, "9")])
    assert book.price_for("a", datetime(2026, 2, 28, 23, 59, tzinfo=UTC)).id == 1
    assert book.price_for("a", datetime(2026, 3, 1, tzinfo=UTC)).id == 2
    assert book.price_for("b", datetime(2026, 3, 1, tzinfo=UTC)).id == 3
    with pytest.raises(NoPriceError):
        book.price_for("b", datetime(2026, 1, 15, tzinfo=UTC))


def test_a_batch_rate_finer_than_a_pico_dollar_is_rounded_and_the_interactive_rate_stays_exact() -> None:

    # 0.0001 USD/Mtok is 100 pico-dollars a token; its 5m write 125; half of that 62.5 rounds (half-even) to 62.
    spec = PriceSpec(
        model="m",
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        input_usd_per_mtok=Decimal("0.0001"),
        output_usd_per_mtok=Decimal("0.0003"),
    )
    assert spec.rates.input == 100 and spec.rates.cache_write_5m == 125
    batch = spec.rates_for(batch=True)
    assert batch.input == 50 and batch.cache_write_5m == 62 and batch.output == 150
