"""The Usage, Cache, Requests and Invoices pages over plain HTTP, on SQLite and PostgreSQL: their numbers
against the ledger and the invoice, the CSV export against the table, paging, filters, bad input, and
tenant isolation (another tenant's invoice is a 404 in every form, next to the owner's 200)."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction

import httpx
import pytest
import sqlalchemy as sa

from billing import budgets
from billing.periods import month_start
from kvgate.db import open_database
from kvgate.tenancy import UsageRecord
from kvgate.usage import TTL_CLASSES, Category, TokenCounts, UsageEvent
from tests.web.html_tables import attribute, plain, rows
from tests.web.pages_setup import SeededTenant, finalize_month, run_async, seed_tenant
from web.formatting import percent, usd

OCTOBER = "preset=custom&start=2026-10-01&end=2026-10-31"
TOKEN_COLUMNS = [c.value for c in Category]
N = len(TOKEN_COLUMNS)


@pytest.fixture(scope="module")
def acme(any_dashboard) -> SeededTenant:  # type: ignore[no-untyped-def]
    return seed_tenant(any_dashboard.server)


@pytest.fixture(scope="module")
def other(any_dashboard) -> SeededTenant:  # type: ignore[no-untyped-def]
    return seed_tenant(any_dashboard.server, "Other Corp", key_names=("gamma",))


@pytest.fixture
def client(acme: SeededTenant) -> Iterator:  # type: ignore[type-arg]
    with acme.client() as c:
        yield c


def test_usage_table_sums_equal_the_ledger_by_day_and_in_total(acme: SeededTenant, client) -> None:  # type: ignore[no-untyped-def]
    html = client.get(f"/usage?{OCTOBER}").text
    buckets = rows(html, "usage-buckets")
    assert [r[0] for r in buckets] == [f"2026-10-{d:02d}" for d in range(1, 32)]
    ledger = acme.ledger_sums("AND started_at >= :s AND started_at < :e", s="2026-10-01", e="2026-11-01")
    footer = rows(html, "usage-detail", "tfoot")[0]
    # Total, requests, then the categories, cost, cost without cache.
    assert [int(plain(v)) for v in footer[2 : 2 + N]] == [ledger[c] for c in TOKEN_COLUMNS]
    assert int(attribute(html, "total-cost", "data-pico")) == ledger["cost_pico"] > 0
    # One day, against the ledger's entries of that day.
    day = acme.ledger_sums("AND started_at >= :s AND started_at < :e", s="2026-10-07", e="2026-10-08")
    oct7 = next(r for r in buckets if r[0] == "2026-10-07")
    assert [int(plain(v)) for v in oct7[1 : 1 + N]] == [day[c] for c in TOKEN_COLUMNS]


def test_usage_filters_by_key_and_model_and_shows_keys_by_name(acme: SeededTenant, client) -> None:  # type: ignore[no-untyped-def]
    alpha = acme.key_ids["alpha"]
    html = client.get(f"/usage?{OCTOBER}&split=key&key={alpha}").text
    ledger = acme.ledger_sums("AND api_key_id = :k", k=alpha)
    assert int(attribute(html, "total-cost", "data-pico")) == ledger["cost_pico"]
    assert {r[1] for r in rows(html, "usage-detail")} == {"alpha"}
    assert alpha not in "".join(c for r in rows(html, "usage-detail") for c in r)
    everything = client.get(f"/usage?{OCTOBER}&split=key").text
    assert {r[1] for r in rows(everything, "usage-detail")} == {"alpha", "beta"}
    by_model = client.get(f"/usage?{OCTOBER}&model=SmolLM2-135M-Instruct").text
    assert {r[1] for r in rows(by_model, "usage-detail")} == {"SmolLM2-135M-Instruct"}
    model_sums = acme.ledger_sums("AND model = :m", m="SmolLM2-135M-Instruct")
    assert int(attribute(by_model, "total-cost", "data-pico")) == model_sums["cost_pico"]
    errors = client.get(f"/usage?{OCTOBER}&status=error&api=messages").text
    error_sums = acme.ledger_sums("AND status = 'error' AND endpoint = 'messages'")
    assert int(attribute(errors, "total-cost", "data-pico")) == error_sums["cost_pico"] > 0


def test_usage_in_dollars_splits_each_day_by_category_summing_to_the_exact_cost(client) -> None:  # type: ignore[no-untyped-def]
    html = client.get(f"/usage?{OCTOBER}&unit=usd").text
    for row in rows(html, "usage-buckets"):
        categories = sum(Decimal(plain(v)) for v in row[1 : 1 + N])
        assert categories == Decimal(plain(row[1 + N])), row


def test_the_split_chart_follows_split_by(acme: SeededTenant, client) -> None:  # type: ignore[no-untyped-def]
    # Split by key draws one series per key, by model one per model; each series sums to its row of
    # the "By ..." table, so the chart and the table show the same split.
    for split, names in (("key", {"alpha", "beta"}), ("model", None)):  # (two models, unnamed here)
        html = client.get(f"/usage?{OCTOBER}&split={split}").text
        header = rows(html, "usage-split-buckets", section="thead")[0][1:]
        if names is not None:
            assert set(header) == names
        columns = list(zip(*(r[1:] for r in rows(html, "usage-split-buckets")), strict=True))
        totals = {
            name: sum(int(plain(v).replace(",", "")) for v in column)
            for name, column in zip(header, columns, strict=True)
        }
        assert len(header) == 2 and sum(totals.values()) == sum(acme.ledger_sums()[c] for c in TOKEN_COLUMNS)
        detail = rows(client.get(f"/usage?{OCTOBER}&split={split}").text, "usage-detail")
        for name, total in totals.items():  # each series is its split's rows of the detail table
            mine = [r for r in detail if r[1] == name]
            assert total == sum(sum(int(plain(v).replace(",", "")) for v in r[3 : 3 + N]) for r in mine), name


def test_hourly_for_ranges_of_two_days_or_less(client) -> None:  # type: ignore[no-untyped-def]
    one_day = rows(client.get("/usage?start=2026-10-05&end=2026-10-05").text, "usage-buckets")
    assert [r[0] for r in one_day] == [f"2026-10-05 {h:02d}:00" for h in range(24)]
    two_days = rows(client.get("/usage?start=2026-10-05&end=2026-10-06").text, "usage-buckets")
    assert len(two_days) == 48
    three_days = rows(client.get("/usage?start=2026-10-05&end=2026-10-07").text, "usage-buckets")
    assert [r[0] for r in three_days] == ["2026-10-05", "2026-10-06", "2026-10-07"]


def test_csv_export_equals_the_detail_table(client) -> None:  # type: ignore[no-untyped-def]
    for query in (OCTOBER, f"{OCTOBER}&split=key&unit=usd", "start=2026-10-05&end=2026-10-05"):
        html = client.get(f"/usage?{query}").text
        response = client.get(f"/usage.csv?{query}")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
        header, *lines = list(csv.reader(io.StringIO(response.text)))
        table = [[plain(c) for c in r] for r in rows(html, "usage-detail")]
        assert lines == table and len(lines) > 0
        assert header[2:] == ["requests", *(f"{c}_tokens" for c in TOKEN_COLUMNS), "cost_usd", "uncached_cost_usd"]


def test_bad_views_are_a_400_with_the_reason(client) -> None:  # type: ignore[no-untyped-def]
    for query, reason in (
        ("preset=yesterday", "preset must be one of"),
        ("start=2026-10-05&end=2026-10-01", "end must be on or after start"),
        ("start=2026-13-01&end=2026-10-01", "start is not a date"),
        ("start=2020-01-01&end=2026-10-01", "at most 400 days"),
        ("unit=eur", "unit must be one of"),
        # Days at datetime's edges overflowed the range's arithmetic (a 500), far future and far past.
        ("start=9999-12-31&end=9999-12-31", "start must be between 1970-01-01 and 9998-12-31"),
        ("start=9999-12-01&end=9999-12-31", "start must be between"),
        ("start=2026-10-01&end=9999-12-31", "end must be between"),
        ("start=0001-01-01&end=0001-01-02", "start must be between"),
    ):
        for path in ("/usage", "/usage.csv", "/cache"):
            response = client.get(f"{path}?{query}")
            assert response.status_code == 400 and reason in response.text, (path, query)
            if path != "/usage.csv":
                assert "<h1>Bad request</h1>" in response.text and "Not allowed" not in response.text
    good = client.get(f"/usage?{OCTOBER}")
    assert good.status_code == 200 and "<h1>Bad request</h1>" not in good.text
    # Every page names its icon, and the icon is served.
    assert '<link rel="icon" href="/static/favicon.svg"' in good.text
    icon = client.get("/static/favicon.svg")
    assert icon.status_code == 200 and icon.text.startswith("<svg")


def test_cache_page_rates_and_savings_match_the_ledger(acme: SeededTenant, client) -> None:  # type: ignore[no-untyped-def]
    html = client.get(f"/cache?{OCTOBER}").text
    ledger = acme.ledger_sums()
    prompt = ledger["input"] + sum(ledger[t.category.value] for t in TTL_CLASSES) + ledger["cache_read"]
    assert rows(html, "cache-by-model") and {r[0] for r in rows(html, "cache-by-key")} == {"alpha", "beta"}
    expected = percent(Fraction(ledger["cache_read"], prompt))
    assert f'id="hit-rate">{expected}<' in html
    assert len(rows(html, "savings-data")) == len(rows(html, "hit-rate-data")) == 31


def test_cache_write_cost_counts_every_ttl_class(acme: SeededTenant, client) -> None:  # type: ignore[no-untyped-def]
    # The seeded month writes under every standard class (30m and 12h too): the Cache page's
    # write cost is the Usage page's write categories, summed, and each class has its columns.
    ledger = acme.ledger_sums()
    assert all(ledger[t.category.value] > 0 for t in TTL_CLASSES if t.standard)
    cache = client.get(f"/cache?{OCTOBER}").text
    usage = client.get(f"/usage?{OCTOBER}&unit=usd").text
    write_columns = [1 + TOKEN_COLUMNS.index(t.category.value) for t in TTL_CLASSES]
    writes = sum(Decimal(plain(row[i])) for row in rows(usage, "usage-buckets") for i in write_columns)
    card = re.search(r"<h2>Cache write cost</h2><p class=\"big\">([^<]+)<", cache)
    assert card is not None and Decimal(plain(card.group(1))) == writes > 0
    by_key = rows(cache, "cache-by-key")
    header = re.search(r'id="cache-by-key">\s*<thead>(.*?)</thead>', cache, re.DOTALL)
    assert header is not None and all(f"Write {t.name}<" in header.group(1) for t in TTL_CLASSES)
    first_write = 5
    for t_index, ttl in enumerate(TTL_CLASSES):
        column = sum(int(plain(r[first_write + t_index]).replace(",", "")) for r in by_key)
        assert column == ledger[ttl.category.value], ttl.name


def test_requests_pages_through_the_whole_ledger_and_finds_a_request(acme: SeededTenant, client) -> None:  # type: ignore[no-untyped-def]
    seen: list[str] = []
    url = "/requests"
    while url:
        html = client.get(url).text
        page_rows = rows(html, "ledger")
        assert 0 < len(page_rows) <= 50
        seen.extend(r[1].split(" ")[0] for r in page_rows)
        found = html.split('rel="next" href="', 1)
        url = found[1].split('"', 1)[0].replace("&amp;", "&") if len(found) > 1 else ""
    entries = len(acme.month.charges) + 1  # and the reversal
    assert len(seen) == entries and len(set(seen)) == entries - 1
    wanted = acme.month.reversed_request_id
    hit = rows(client.get("/requests", params={"q": wanted}).text, "ledger")
    assert [r[1] for r in hit] == [f"{wanted} (reversal)", wanted]
    assert {r[2] for r in hit} <= {"alpha", "beta"}
    miss = rows(client.get("/requests", params={"q": "req_nothing_like_it"}).text, "ledger")
    assert miss == [["No request req_nothing_like_it."]]


def test_invoice_totals_equal_the_usage_page(acme: SeededTenant, client) -> None:  # type: ignore[no-untyped-def]
    invoice = finalize_month(acme)
    page = client.get(f"/invoices/{invoice['id']}/document").text  # the issued document, framed by the page
    usage = client.get(f"/usage?{OCTOBER}").text
    exact = int(attribute(page, "invoice-subtotal", "data-exact-pico"))
    assert exact == int(attribute(usage, "total-cost", "data-pico"))
    assert int(attribute(page, "invoice-total", "data-cents")) == round(float(invoice["total_usd"]) * 100)
    tokens = {c: 0 for c in TOKEN_COLUMNS}
    for line in invoice["lines"]:
        tokens[line["category"]] += line["tokens"]
    footer = rows(usage, "usage-detail", "tfoot")[0]
    assert [int(plain(v)) for v in footer[2 : 2 + N]] == [tokens[c] for c in TOKEN_COLUMNS]
    listed = rows(client.get("/invoices").text, "invoices")
    mine = next(r for r in listed if r[1] == "2026-10")
    assert mine[0] == invoice["number"] and mine[2] == "finalized" and plain(mine[3]) == invoice["total_usd"]


def test_another_tenants_invoice_is_not_found_in_every_form(acme: SeededTenant, other: SeededTenant) -> None:
    invoice = finalize_month(acme)
    with acme.client() as owner, other.client() as stranger:
        for suffix in ("", ".pdf", ".csv"):
            path = f"/invoices/{invoice['id']}{suffix}"
            mine = owner.get(path)
            assert mine.status_code == 200, path
            theirs = stranger.get(path)
            assert theirs.status_code == 404, path
            assert invoice["number"] not in theirs.text and acme.tenant_id not in theirs.text
        assert owner.get(f"/invoices/{invoice['id']}.pdf").content.startswith(b"%PDF")
        note = acme.server.admin.post(
            f"/admin/v1/invoices/{invoice['id']}/credit-notes", json={"amount_usd": "0.01", "reason": "goodwill"}
        )
        note.raise_for_status()
        for suffix in ("", ".pdf"):
            path = f"/credit-notes/{note.json()['id']}{suffix}"
            assert owner.get(path).status_code == 200, path
            theirs = stranger.get(path)
            assert theirs.status_code == 404, path
            assert note.json()["number"] not in theirs.text and invoice["number"] not in theirs.text
        assert note.json()["number"] in owner.get("/invoices").text
        assert stranger.get("/invoices/999999999").status_code == 404
        assert stranger.get(f"/invoices/{2**63}").status_code == 404
        # Nor do their usage, ledger or search show the other tenant's requests.
        wanted = acme.month.reversed_request_id
        assert len(rows(owner.get("/requests", params={"q": wanted}).text, "ledger")) == 2
        assert rows(stranger.get("/requests", params={"q": wanted}).text, "ledger") == [[f"No request {wanted}."]]
        theirs = stranger.get(f"/usage?{OCTOBER}&split=key").text
        assert {r[1] for r in rows(theirs, "usage-detail")} == {"gamma"}
        assert int(attribute(theirs, "total-cost", "data-pico")) == other.ledger_sums()["cost_pico"]
        assert {r[1] for r in rows(owner.get(f"/usage?{OCTOBER}&split=key").text, "usage-detail")} == {"alpha", "beta"}


def test_invoice_csv_lists_the_billed_entries_adding_up_to_the_exact_total(acme: SeededTenant, client) -> None:  # type: ignore[no-untyped-def]
    invoice = finalize_month(acme)
    body = client.get(f"/invoices/{invoice['id']}.csv").text
    records = list(csv.DictReader(io.StringIO(body)))
    assert len(records) == len(acme.month.charges) + 1
    assert {r["tenant_id"] for r in records} == {acme.tenant_id}
    exact = sum(Decimal(line["exact_amount_usd"]) for line in invoice["lines"])
    assert sum(Decimal(r["cost_usd"]) for r in records) == exact
    # Its token columns are in the one category order, as the usage CSV's are.
    header = next(csv.reader(io.StringIO(body)))
    assert [c for c in header if c.endswith("_tokens")] == [f"{c}_tokens" for c in TOKEN_COLUMNS]


def test_pages_need_a_session(any_dashboard) -> None:  # type: ignore[no-untyped-def]
    with any_dashboard.client() as anonymous:
        for path in ("/usage", "/usage.csv", "/cache", "/requests", "/invoices", "/invoices/1", "/invoices/1.pdf"):
            response = anonymous.get(path)
            assert response.status_code in (303, 401) and response.headers.get("location", "/login") == "/login"


def usage_api_by_day_and_model(acme: SeededTenant) -> dict[tuple[str, str], list[str]]:
    """October from GET /v1/organization/usage/completions (a usage:read key), as the page's detail rows."""
    key = acme.server.new_key(acme.tenant_id, name="reporting", scopes=["usage:read"])
    start, end = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)
    params: dict[str, object] = {
        "start_time": int(start.timestamp()),
        "end_time": int(end.timestamp()),
        "bucket_width": "1d",
        "group_by": "model",
        "limit": 31,
    }
    found: dict[tuple[str, str], list[str]] = {}
    with httpx.Client(base_url=acme.server.base_url, headers={"authorization": f"Bearer {key.key}"}) as api:
        while True:
            body = api.get("/v1/organization/usage/completions", params=params).json()
            for bucket in body["data"]:
                day = datetime.fromtimestamp(bucket["start_time"], UTC).strftime("%Y-%m-%d")
                for r in bucket["results"]:
                    found[(day, r["model"])] = [
                        str(r["num_model_requests"]),
                        str(r["input_uncached_tokens"]),
                        *(str(r[f"{c}_tokens"]) for c in TOKEN_COLUMNS if c.startswith("cache_write")),
                        str(r["input_cached_tokens"]),
                        str(r["output_tokens"]),
                        r["cost_usd"],
                        r["uncached_cost_usd"],
                    ]
            if not body["has_more"]:
                return found
            params["page"] = body["next_page"]


def test_usage_table_equals_the_usage_api(acme: SeededTenant, client) -> None:  # type: ignore[no-untyped-def]
    table = rows(client.get(f"/usage?{OCTOBER}").text, "usage-detail")
    shown = {(r[0], r[1]): [plain(c) for c in r[2:]] for r in table}
    from_api = usage_api_by_day_and_model(acme)
    assert shown == from_api and len(shown) >= 31
    # And the API's own figures add up to the ledger (so all three agree).
    assert sum(Decimal(v[1 + N]) for v in from_api.values()) == Decimal(acme.ledger_sums()["cost_pico"]).scaleb(-12)


class _StripeInvoices:
    def retrieve(self, invoice_id: str) -> object:
        return type("StripeInvoice", (), {"id": invoice_id, "hosted_invoice_url": f"https://pay.example/{invoice_id}"})


class _StripeClient:
    """Stands in for stripe.StripeClient: the dashboard only asks it for an invoice's hosted page."""

    v1 = type("V1", (), {"invoices": _StripeInvoices()})


def test_stripe_hosted_link_for_a_pushed_invoice_only_to_its_tenant(
    acme: SeededTenant, other: SeededTenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    import web.pages.invoices

    invoice = finalize_month(acme)
    with acme.client() as owner, other.client() as stranger:
        # Not pushed to Stripe: no link, and /pay is a 404.
        assert "/pay" not in owner.get(f"/invoices/{invoice['id']}").text
        assert owner.get(f"/invoices/{invoice['id']}/pay").status_code == 404
        monkeypatch.setattr(web.pages.invoices, "client_from_settings", lambda settings: _StripeClient())
        with acme.server.db.begin() as conn:
            conn.execute(
                sa.text("UPDATE invoices SET stripe_invoice_id = :s WHERE id = :i"),
                {"s": f"in_test_{invoice['id']}_{acme.tenant_id[-6:]}", "i": invoice["id"]},
            )
        assert f'href="/invoices/{invoice["id"]}/pay"' in owner.get(f"/invoices/{invoice['id']}").text
        paid = owner.get(f"/invoices/{invoice['id']}/pay", follow_redirects=False)
        assert paid.status_code == 303
        assert paid.headers["location"] == f"https://pay.example/in_test_{invoice['id']}_{acme.tenant_id[-6:]}"
        theirs = stranger.get(f"/invoices/{invoice['id']}/pay", follow_redirects=False)
        assert theirs.status_code == 404 and "pay.example" not in theirs.text


def test_the_admin_page_shows_what_is_still_due_tax_included_and_credits_taken_off(any_dashboard) -> None:  # type: ignore[no-untyped-def]
    seeded = seed_tenant(any_dashboard.server, "Unpaid AG", key_names=("main",))
    profile = {"legal_name": "Unpaid AG", "tax": {"treatment": "standard", "rate_percent": 19, "note": None}}
    admin = any_dashboard.server.admin
    admin.put(f"/admin/v1/tenants/{seeded.tenant_id}/billing-profile", json=profile).raise_for_status()
    invoice = finalize_month(seeded)
    assert Decimal(invoice["tax_usd"]) > 0
    noted = admin.post(f"/admin/v1/invoices/{invoice['id']}/credit-notes", json={"amount_usd": "0.01", "reason": "t"})
    noted.raise_for_status()
    due = Decimal(admin.get(f"/admin/v1/invoices/{invoice['id']}").json()["amount_due_usd"])
    assert due == Decimal(invoice["total_usd"]) - Decimal("0.01") != Decimal(invoice["subtotal_usd"])
    with any_dashboard.operator_client() as client:
        html = client.get("/admin").text
    row = re.search(rf'data-tenant-id="{seeded.tenant_id}".*?</tr>', html, re.DOTALL)
    assert row is not None and f"1 (${due:,.2f})" in row.group(0), row.group(0) if row else html


def test_refusals_are_counted_in_words_listed_and_the_reserve_in_flight_is_drawn(
    acme: SeededTenant, other: SeededTenant
) -> None:
    """Refused requests (usage records with status "refused", gateway/refusals.py) on the Overview and on
    Requests, and a reservation in flight beside the spend on the budget bar; the other tenant sees none."""
    now = datetime.now(UTC)
    key = other.key_ids["gamma"]
    refusals = [("rate_limit", None), ("tenant_month", 7 * 10**9), ("tenant_month", 9 * 10**9)]
    budget = {"monthly_limit_usd": "1.00"}
    other.server.admin.put(f"/admin/v1/tenants/{other.tenant_id}/budget", json=budget).raise_for_status()

    async def write() -> None:
        async with open_database(other.server.database_url) as sessions, sessions() as session:
            for i, (reason, reserve) in enumerate(refusals):
                event = UsageEvent(
                    request_id=f"req_refused_{other.tenant_id[-8:]}_{i}",
                    tenant_id=other.tenant_id,
                    api_key_id=key,
                    model="" if reserve is None else other.server.model,
                    endpoint="messages",
                    started_at=now,
                    counts=TokenCounts(),
                    ttft_ms=None,
                    latency_ms=1,
                    status="refused",
                    refusal_reason=reason,
                    refusal_reserve_pico=reserve,
                )
                session.add(UsageRecord(**event.as_row()))
            limits = await budgets.limits_for(
                session=session, tenant_id=other.tenant_id, api_key_id=key, month=month_start(now)
            )
            held = await budgets.reserve(
                session=session,
                request_id=f"req_inflight_{other.tenant_id[-8:]}",
                tenant_id=other.tenant_id,
                api_key_id=key,
                amount_pico=250 * 10**9,  # $0.25 of the $1.00 budget
                now=now,
                limits=limits,
            )
            assert held is not None
            await session.commit()

    run_async(write)
    with other.client() as theirs, acme.client() as mine:
        overview = theirs.get("/").text
        reasons = re.findall(r'data-reason="(\w+)" data-requests="(\d+)">([^<]*)<', overview)
        assert sorted((r, int(n)) for r, n, _ in reasons) == [("rate_limit", 1), ("tenant_month", 2)]
        assert all(("budget" in w) != ("rate limit" in w) for _, _, w in reasons), reasons
        assert "max_tokens at the output price" in overview
        assert 'data-pico="250000000000"' in overview  # the reserve in flight, written out
        assert "fill reserve w25" in overview  # and drawn after the spend
        listed = rows(theirs.get("/requests").text, "refusals")
        assert sorted(r[1] for r in listed) == [f"req_refused_{other.tenant_id[-8:]}_{i}" for i in range(3)]
        assert sorted(r[6] for r in listed) == sorted(["—", usd(7 * 10**9), usd(9 * 10**9)])
        # The tenant beside it was refused nothing: none counted, none listed, no reserve drawn.
        own = mine.get("/").text
        assert 'id="refused-count" data-requests="0"' in own and "fill reserve" not in own
        assert rows(mine.get("/requests").text, "refusals") == [["No refused requests."]]
