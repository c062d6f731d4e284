"""The billing CLI against a real (SQLite) database, driven as a user would (`kvgate.cli.main`): each
command, every listing in table, JSON and CSV (JSON equal to the admin API's answer for the same data),
and clear errors with exit status 1 (2 for a malformed option, as click reports it)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI
from pypdf import PdfReader

from billing.api import admin_router
from billing.hooks import GatewayBilling
from billing.ledger import UsageCharge
from billing.service import BillingService
from billing.settings import BillingSettings
from gateway.api.errors import install_error_handlers
from kvgate.cli import main
from kvgate.db import migrate, open_database
from kvgate.tenancy import ApiKey, Tenant
from kvgate.usage import TokenCounts

FEB = datetime(2026, 2, 1, tzinfo=UTC)


def charge(request_id: str, key: str, model: str, day: int, counts: TokenCounts) -> UsageCharge:
    return UsageCharge(
        request_id=request_id,
        tenant_id="ten_cli",
        api_key_id=key,
        model=model,
        endpoint="messages",
        status="ok",
        started_at=FEB + timedelta(days=day),
        counts=counts,
    )


def settle(url: str, spool, charges: list[UsageCharge]) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        async with open_database(url) as sessions:
            service = await BillingService.start(sessions=sessions, settings=BillingSettings(spool_path=spool))
            for c in charges:
                await service.settle(c)

    asyncio.run(go())


@pytest.fixture
def db(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("KVGATE_DATABASE_URL", url)
    monkeypatch.chdir(tmp_path)
    migrate(url)

    async def seed() -> None:
        async with open_database(url) as sessions, sessions() as session:
            session.add(Tenant(id="ten_cli", name="CLI Co", status="active"))
            await session.flush()
            session.add(ApiKey(id="key_cli", tenant_id="ten_cli", name="k", key_hash="h" * 64, prefix="kvg-x"))
            session.add(ApiKey(id="key_two", tenant_id="ten_cli", name="second", key_hash="g" * 64, prefix="kvg-y"))
            await session.commit()

    asyncio.run(seed())
    counts = TokenCounts(input=10**6, cache_write_5m=10**6, cache_read=10**7, output=10**6)
    settle(url, tmp_path / "s", [charge(f"cli-{i}", "key_cli", "SmolLM2-135M-Instruct", i, counts) for i in range(6)])
    return url


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, " ".join(out.err.replace("│", " ").split())


def admin_get(url: str, path: str, params=None):  # type: ignore[no-untyped-def]
    """The admin API's JSON for the same database (the CLI's JSON must equal it)."""

    async def go():  # type: ignore[no-untyped-def]
        async with open_database(url) as sessions:
            app = FastAPI()
            install_error_handlers(app)
            app.include_router(admin_router, prefix="/admin/v1")
            service = await BillingService.start(sessions=sessions, settings=BillingSettings(), seed=False)
            app.state.gateway = SimpleNamespace(billing=GatewayBilling(service))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://billing.test") as client:
                r = await client.get(f"/admin/v1{path}", params=params)
                assert r.status_code == 200, r.text
                return r.json()

    return asyncio.run(go())


def check_csv(text: str, expected: list[dict]) -> None:
    """CSV: the API's field names as the header, one line per row, the same scalar values."""
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(expected)
    assert list(rows[0]) == list(expected[0])
    for got, want in zip(rows, expected, strict=True):
        for name, value in want.items():
            if value is None:
                assert got[name] == ""
            elif isinstance(value, bool):
                assert got[name] == str(value)
            elif isinstance(value, str | int | float):
                assert got[name] == str(value), name


def right_aligned(table: str, header: str, value: str) -> bool:
    """Whether `value` ends where its column's header ends (rich right-justifies numbers)."""
    lines = table.splitlines()
    head = next(line for line in lines if header in line)
    row = next(line for line in lines[lines.index(head) + 1 :] if value in line)
    return head.index(header) + len(header) == row.index(value) + len(value)


def finalize_and_credit(capsys) -> int:  # type: ignore[no-untyped-def]
    out = run(capsys, "invoices", "list", "-o", "json")[1]
    invoice_id = json.loads(out)[0]["id"]
    assert run(capsys, "invoices", "finalize", str(invoice_id))[0] == 0
    assert run(capsys, "credit-notes", "create", str(invoice_id), "0.35", "--reason", "goodwill")[0] == 0
    return invoice_id


LISTINGS = [
    # (CLI command, admin API path, params, the API's rows)
    (("prices", "list"), "/prices", None, "data"),
    (("usage", "list", "--tenant", "ten_cli"), "/usage", {"tenant_id": "ten_cli"}, "data"),
    (
        ("usage", "summary", "--group-by", "model", "--group-by", "key"),
        "/usage/summary",
        [("group_by", "model"), ("group_by", "key")],
        "data",
    ),
    (("invoices", "list"), "/invoices", None, "data"),
    (("credit-notes", "list"), "/credit-notes", None, "data"),
    (("budgets", "show", "ten_cli"), "/tenants/ten_cli/budget", None, None),
    (("billing-profile", "show", "ten_cli"), "/tenants/ten_cli/billing-profile", None, None),
    (("invoices", "show", "{invoice}"), "/invoices/{invoice}", None, None),
]


@pytest.mark.parametrize(("argv", "path", "params", "rows"), LISTINGS, ids=[" ".join(x[0][:2]) for x in LISTINGS])
def test_every_listing_in_three_formats(db, capsys, argv, path, params, rows):
    invoice_id = finalize_and_credit(capsys)
    argv = tuple(a.format(invoice=invoice_id) for a in argv)
    api = admin_get(db, path.format(invoice=invoice_id), params)
    expected = api[rows] if rows else [api]
    assert expected and all(isinstance(row, dict) for row in expected)

    code, out, err = run(capsys, *argv, "--output", "json")
    assert code == 0, err
    got = json.loads(out)
    assert (got if rows else [got]) == expected  # the admin API's names and values, field for field

    code, out, err = run(capsys, *argv, "-o", "csv")
    assert code == 0, err
    check_csv(out, expected)

    code, out, err = run(capsys, *argv)
    assert code == 0 and out.strip() and not out.lstrip().startswith(("{", "[")), err
    assert "(none)" not in out


def test_tables_align_numbers_and_show_none(db, capsys):
    code, out, _ = run(capsys, "usage", "list", "--tenant", "ten_cli")
    assert code == 0 and right_aligned(out, "cost $", "0.725") and right_aligned(out, "input", "1,000,000")
    # Keys by name in the table (key_cli is named "k"); by id in JSON, as the API has them.
    assert "key_cli" not in out and all(" k " in line for line in out.splitlines()[2:])
    assert {r["api_key_id"] for r in json.loads(run(capsys, "usage", "list", "-o", "json")[1])} == {"key_cli"}
    code, out, _ = run(capsys, "prices", "list")
    # Fixed decimals per column: 0.10 beside 0.40, multipliers 1.25 beside 2.00.
    assert "0.10" in out and "0.40" in out and "2.00" in out and right_aligned(out, "write 5m x", "1.25")
    assert run(capsys, "credit-notes", "list")[1].strip() == "(none)"
    assert json.loads(run(capsys, "credit-notes", "list", "-o", "json")[1]) == []
    assert run(capsys, "credit-notes", "list", "-o", "csv")[1] == "id,invoice_id,number,amount_usd,reason,created_at\n"


def test_usage_commands(db, capsys, tmp_path):
    code, out, _ = run(capsys, "usage", "list", "--tenant", "ten_cli", "-o", "json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 6
    # Per request: 1M in at $0.10 + 1M 5m-writes at $0.125 + 10M reads at $0.01 + 1M out at $0.40 = $0.725.
    assert {row["cost_usd"] for row in rows} == {"0.725"}
    code, out, _ = run(capsys, "usage", "summary", "--group-by", "day", "-o", "json", "--start", "2026-02-02T00:00:00Z")
    assert code == 0 and [r["day"] for r in json.loads(out)] == [f"2026-02-0{d}" for d in range(2, 7)]
    # A bare date is UTC midnight: the same answer.
    assert run(capsys, "usage", "summary", "-o", "json", "--start", "2026-02-02")[1] == out
    code, out, _ = run(capsys, "usage", "export", "--out", str(tmp_path / "u.csv"))
    rows = list(csv.DictReader((tmp_path / "u.csv").open()))
    assert code == 0 and sum(Decimal(r["cost_usd"]) for r in rows) == Decimal("4.35")
    assert run(capsys, "usage", "reverse", "cli-0", "--reason", "test")[0] == 0
    code, out, _ = run(capsys, "usage", "summary", "--group-by", "model", "-o", "json")
    assert json.loads(out)[0]["cost_usd"] == "3.625" and json.loads(out)[0]["requests"] == 5


def test_usage_summary_by_two_groups_with_names_hit_rate_and_savings(db, capsys, tmp_path):
    one_hour = TokenCounts(input=1000, cache_write_1h=4000, cache_read=5000, output=100)
    settle(db, tmp_path / "s", [charge(f"two-{i}", "key_two", "tiny", 10 + i, one_hour) for i in range(3)])
    code, out, _ = run(capsys, "usage", "summary", "-g", "key", "-g", "model", "--month", "2026-02", "-o", "json")
    rows = json.loads(out)
    assert code == 0 and [(r["model"], r["api_key_name"]) for r in rows] == [
        ("SmolLM2-135M-Instruct", "k"),
        ("tiny", "second"),
    ]
    smol, tiny = rows
    assert smol["hit_rate"] == round(10 / 12, 4) and tiny["hit_rate"] == 0.5
    assert tiny["cache_write_1h_tokens"] == 12000 and tiny["cache_write_5m_tokens"] == 0
    assert Decimal(smol["saved_usd"]) == Decimal(smol["uncached_cost_usd"]) - Decimal(smol["cost_usd"]) > 0
    code, table, _ = run(capsys, "usage", "summary", "-g", "model", "-g", "key", "--month", "2026-02")
    header = table.splitlines()[0]
    for title in ("model", "key", "write 5m", "write 1h", "hit %", "cost $", "saved $"):
        assert title in header, title
    assert "write 24h" not in header  # a TTL class nobody wrote gets no column
    assert "second" in table and "key_two" in table and right_aligned(table, "hit %", "50.0")
    # Another month has nothing; --month with --start is refused.
    assert run(capsys, "usage", "summary", "--month", "2026-03")[1].strip() == "(none)"
    code, _, err = run(capsys, "usage", "summary", "--month", "2026-02", "--start", "2026-02-01")
    assert code == 1 and "not both" in err


def test_invoice_commands(db, capsys, tmp_path):
    code, out, _ = run(capsys, "invoices", "list", "-o", "json")
    (invoice,) = json.loads(out)
    assert code == 0 and invoice["status"] == "draft" and invoice["total_usd"] == "4.35"
    code, out, _ = run(capsys, "invoices", "finalize", str(invoice["id"]))
    assert code == 0 and "finalized as KVG-" in out
    code, _, err = run(capsys, "invoices", "finalize", str(invoice["id"]))
    assert code == 1 and "already finalized" in err
    code, out, _ = run(capsys, "invoices", "pdf", str(invoice["id"]), "--out", str(tmp_path / "i.pdf"))
    text = " ".join(" ".join(p.extract_text() for p in PdfReader(tmp_path / "i.pdf").pages).split())
    assert code == 0 and "Total $4.35" in text
    code, out, _ = run(capsys, "credit-notes", "create", str(invoice["id"]), "0.35", "--reason", "goodwill")
    assert code == 0 and "KVG-CN-" in out
    code, _, err = run(capsys, "credit-notes", "create", str(invoice["id"]), "5", "--reason", "too much")
    assert code == 1 and "left to credit" in err
    code, out, _ = run(capsys, "invoices", "show", str(invoice["id"]), "-o", "json")
    shown = json.loads(out)
    assert shown["amount_due_usd"] == "4.00" and len(shown["lines"]) == 4
    code, table, _ = run(capsys, "invoices", "show", str(invoice["id"]))
    assert code == 0 and "amount_due_usd" in table and "Lines" in table and shown["number"] in table
    code, _, err = run(capsys, "invoices", "push", str(invoice["id"]))
    assert code == 1 and "STRIPE_API_KEY" in err
    code, _, err = run(capsys, "invoices", "push-due")
    assert code == 1 and "STRIPE_API_KEY" in err
    code, out, _ = run(capsys, "invoices", "csv", str(invoice["id"]))
    rows = list(csv.DictReader(out.splitlines()))
    assert code == 0 and len(rows) == 4 and {r["invoice"] for r in rows} == {shown["number"]}
    assert sum(Decimal(r["amount_usd"]) for r in rows) == Decimal("4.35")
    assert [r["amount_usd"] for r in rows] == [line["amount_usd"] for line in shown["lines"]]
    assert [r["exact_amount_usd"] for r in rows] == [line["exact_amount_usd"] for line in shown["lines"]]
    code, out, _ = run(capsys, "invoices", "csv", str(invoice["id"]), "--out", str(tmp_path / "lines.csv"))
    assert code == 0 and (tmp_path / "lines.csv").read_text().startswith("invoice,position,model")
    assert run(capsys, "invoices", "csv", "999999")[0] == 1
    code, out, _ = run(capsys, "invoices", "list", "--status", "finalized", "--month", "2026-02", "-o", "json")
    assert code == 0 and [i["id"] for i in json.loads(out)] == [invoice["id"]]
    assert json.loads(run(capsys, "invoices", "list", "--status", "draft", "-o", "json")[1]) == []


def test_price_carry_over_warns_naming_what_it_carried(db, capsys):
    base = ("prices", "add", "carry-model")
    code, out, err = run(capsys, *base, "--effective-from", "2026-01-01", "--input", "1", "--output", "2",
                         "--cache-write-24h-multiplier", "3")  # fmt: skip
    assert code == 0 and "warning" not in err  # a first version has nothing to carry
    code, out, err = run(capsys, *base, "--effective-from", "2026-03-01", "--input", "3", "--output", "15")
    assert code == 0 and err.startswith("warning: carried over from price version")
    for carried in ("cache_write_5m_multiplier=1.25", "cache_write_24h_multiplier=3.00", "cache_read_multiplier=0.10"):
        assert carried in err, carried
    assert "input_usd_per_mtok" not in err
    every = ["--input", "4", "--output", "16", "--cache-read-multiplier", "0.1", "--cache-write-24h-multiplier", "none"]
    for ttl in ("5m", "30m", "1h", "12h"):
        every += [f"--cache-write-{ttl}-multiplier", "2"]
    code, out, err = run(capsys, *base, "--effective-from", "2026-06-01", *every)
    assert code == 0 and err == ""  # every field set: nothing carried, no warning
    code, out, _ = run(capsys, "prices", "list", "--model", "carry-model", "-o", "json")
    versions = json.loads(out)
    assert [v["cache_write_24h_multiplier"] for v in versions] == ["3.00", "3.00", None]
    assert [v["input_usd_per_mtok"] for v in versions] == ["1.00", "3.00", "4.00"]
    assert "24h" in versions[1]["ttl_classes"] and "24h" not in versions[2]["ttl_classes"]
    code, _, err = run(capsys, "prices", "add", "fresh-model", "--effective-from", "2026-01-01", "--input", "1")
    assert code == 1 and "output_usd_per_mtok" in err


def test_budgets_show_is_a_table_with_key_limits(db, capsys):
    assert run(capsys, "budgets", "set-key", "key_cli", "--monthly-limit", "5")[0] == 0
    code, out, _ = run(capsys, "budgets", "set", "ten_cli", "--monthly-limit", "25.5", "--prepaid", "-o", "json")
    assert code == 0 and json.loads(out)["monthly_limit_usd"] == "25.5" and json.loads(out)["prepaid"]
    code, table, _ = run(capsys, "budgets", "show", "ten_cli")
    assert code == 0 and not table.lstrip().startswith("{")
    lines = table.splitlines()
    key_line = next(line for line in lines if "key_cli" in line)
    assert "key month" in key_line and " k " in key_line and "5.00" in key_line
    assert any("second" in line and "key_two" in line for line in lines)  # a key without a limit is listed too
    assert any("tenant month" in line and "25.50" in line for line in lines)
    assert any("prepaid credit" in line for line in lines) and right_aligned(table, "limit $", "25.50")
    shown = json.loads(run(capsys, "budgets", "show", "ten_cli", "-o", "json")[1])
    assert shown == admin_get(db, "/tenants/ten_cli/budget")
    assert [(k["name"], k["monthly_limit_usd"]) for k in shown["keys"]] == [("k", "5"), ("second", None)]


def test_budget_price_and_spool_commands(db, capsys):
    code, out, _ = run(capsys, "credits", "grant", "ten_cli", "10", "--idempotency-key", "g1")
    assert code == 0 and out.startswith("granted")
    code, out, _ = run(capsys, "credits", "grant", "ten_cli", "10", "--idempotency-key", "g1")
    assert out.startswith("already granted")
    assert run(capsys, "budgets", "set-key", "key_cli", "--monthly-limit", "none")[0] == 0
    new_model = ("prices", "add", "new-model", "--effective-from", "2026-05-01T00:00:00Z")
    code, out, _ = run(capsys, *new_model, "--input", "0.2", "--output", "0.8")
    assert code == 0 and "new-model" in out
    code, out, _ = run(capsys, "prices", "list", "--model", "new-model", "-o", "json")
    assert json.loads(out)[0]["input_usd_per_mtok"] == "0.20"
    code, out, _ = run(capsys, "prices", "seed")
    assert code == 0 and "0 new price versions" in out
    assert run(capsys, "spool", "status")[1].startswith("0 records")
    for argv, message in (
        (("budgets", "set", "nope", "--monthly-limit", "1"), "no tenant"),
        (("budgets", "set", "ten_cli", "--monthly-limit", "1.0000000000001"), "pico-dollar"),
        (("credits", "grant", "ten_cli", "--", "-1"), "positive"),  # -- : a negative number is not an option
        # Beyond what a 64-bit pico-dollar column holds: a clear error naming the argument, not a crash.
        (("credits", "grant", "ten_cli", "9200000"), "amount_usd: 9200000 USD is more than the largest amount"),
        (("credits", "grant", "ten_cli", "1e999999"), "amount_usd"),
        (("budgets", "set", "ten_cli", "--monthly-limit", "9223372.036854775808"), "--monthly-limit"),
        (("budgets", "set-key", "key_cli", "--monthly-limit", "10000000"), "--monthly-limit"),
        ((*new_model, "--input", "0.3", "--output", "1"), "already has a version"),
        (("prices", "add", "m", "--effective-from", "2026-05-01", "--input", "x", "--output", "1"), "--input"),
        (("usage", "list", "--start", "2026-02-02", "--end", "2026-02-01"), "must be after"),
        (("invoices", "show", "424242"), "no invoice"),
    ):
        code, _, err = run(capsys, *argv)
        assert code == 1 and message in err and err.startswith("error:"), (argv, err)
    # A malformed option is click's usage error (exit 2), naming the option.
    code, _, err = run(capsys, "prices", "add", "m", "--effective-from", "2026-05-01T00:00:00", "--input", "1")
    assert code == 2 and "--effective-from" in err and "no time zone" in err
    code, _, err = run(capsys, "usage", "summary", "--group-by", "week")
    assert code == 2 and "--group-by" in err


READ_ONLY = [
    ("prices", "list"),
    ("usage", "list"),
    ("usage", "summary", "-g", "model", "-g", "key"),
    ("usage", "export"),
    ("invoices", "list"),
    ("invoices", "show", "1"),
    ("invoices", "csv", "1"),
    ("invoices", "pdf", "1"),
    ("credit-notes", "list"),
    ("budgets", "show", "ten_x"),
    ("billing-profile", "show", "ten_x"),
    ("spool", "status"),
]


def test_read_only_commands_never_create_a_database(tmp_path, monkeypatch, capsys):
    path = tmp_path / "elsewhere" / "kvgate.db"
    path.parent.mkdir()
    monkeypatch.setenv("KVGATE_DATABASE_URL", f"sqlite:///{path}")
    monkeypatch.chdir(tmp_path)
    for argv in READ_ONLY:
        code, out, err = run(capsys, *argv)
        assert code == 1 and f"no database at {path}" in err and "KVGATE_DATABASE_URL" in err, (argv, err)
        assert not path.exists() and list(tmp_path.glob("*.db")) == [], argv
    # A command that writes creates it; then the reads work.
    assert run(capsys, "prices", "seed")[0] == 0 and path.exists()
    code, out, _ = run(capsys, "prices", "list", "-o", "json")
    assert code == 0 and {v["model"] for v in json.loads(out)} >= {"*"}
