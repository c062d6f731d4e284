"""The billing CLI against a real (SQLite) database: each command, and clear errors with exit status 1."""

from __future__ import annotations

import asyncio
import csv
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from pypdf import PdfReader

from billing.ledger import UsageCharge
from billing.service import BillingService
from billing.settings import BillingSettings
from kvgate.cli import main
from kvgate.db import migrate, open_database
from kvgate.tenancy import ApiKey, Tenant
from kvgate.usage import TokenCounts


@pytest.fixture
def db(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("KVGATE_DATABASE_URL", url)
    monkeypatch.chdir(tmp_path)
    migrate(url)

    async def seed() -> None:
        async with open_database(url) as sessions:
            async with sessions() as session:
                session.add(Tenant(id="ten_cli", name="CLI Co", status="active"))
                await session.flush()
                session.add(ApiKey(id="key_cli", tenant_id="ten_cli", name="k", key_hash="h" * 64, prefix="kvg-x"))
                await session.commit()
            service = await BillingService.start(sessions=sessions, settings=BillingSettings(spool_path=tmp_path / "s"))
            for i in range(6):
                await service.settle(
                    UsageCharge(
                        request_id=f"cli-{i}",
                        tenant_id="ten_cli",
                        api_key_id="key_cli",
                        model="SmolLM2-135M-Instruct",
                        endpoint="messages",
                        status="ok",
                        started_at=datetime(2026, 2, 1, tzinfo=UTC) + timedelta(days=i),
                        counts=TokenCounts(input=10**6, cache_write_5m=10**6, cache_read=10**7, output=10**6),
                    )
                )

    asyncio.run(seed())
    return url


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_usage_commands(db, capsys, tmp_path):
    code, out, _ = run(capsys, "usage", "list", "--tenant", "ten_cli", "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 6
    # Per request: 1M in at $0.10 + 1M 5m-writes at $0.125 + 10M reads at $0.01 + 1M out at $0.40 = $0.725.
    assert {row["cost_usd"] for row in rows} == {"0.725"}
    code, out, _ = run(capsys, "usage", "summary", "--group-by", "day", "--json", "--start", "2026-02-02T00:00:00Z")
    assert code == 0 and [r["day"] for r in json.loads(out)] == [f"2026-02-0{d}" for d in range(2, 7)]
    code, out, _ = run(capsys, "usage", "export", "--out", str(tmp_path / "u.csv"))
    rows = list(csv.DictReader((tmp_path / "u.csv").open()))
    assert code == 0 and sum(Decimal(r["cost_usd"]) for r in rows) == Decimal("4.35")
    assert run(capsys, "usage", "reverse", "cli-0", "--reason", "test")[0] == 0
    code, out, _ = run(capsys, "usage", "summary", "--group-by", "model", "--json")
    assert json.loads(out)[0]["cost_usd"] == "3.625" and json.loads(out)[0]["requests"] == 5


def test_invoice_commands(db, capsys, tmp_path):
    code, out, _ = run(capsys, "invoices", "list", "--json")
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
    code, out, _ = run(capsys, "invoices", "show", str(invoice["id"]))
    shown = json.loads(out)
    assert shown["amount_due_usd"] == "4.00" and len(shown["lines"]) == 4
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


def test_budget_price_and_spool_commands(db, capsys):
    code, out, _ = run(capsys, "budgets", "set", "ten_cli", "--monthly-limit", "25.5", "--prepaid")
    assert code == 0 and json.loads(out)["monthly_limit_usd"] == "25.5" and json.loads(out)["prepaid"]
    code, out, _ = run(capsys, "credits", "grant", "ten_cli", "10", "--idempotency-key", "g1")
    assert code == 0 and out.startswith("granted")
    code, out, _ = run(capsys, "credits", "grant", "ten_cli", "10", "--idempotency-key", "g1")
    assert out.startswith("already granted")
    assert run(capsys, "budgets", "set-key", "key_cli", "--monthly-limit", "none")[0] == 0
    code, out, _ = run(
        capsys,
        "prices",
        "add",
        "new-model",
        "--effective-from",
        "2026-05-01T00:00:00Z",
        "--input",
        "0.2",
        "--output",
        "0.8",
    )
    assert code == 0 and "new-model" in out
    code, out, _ = run(capsys, "prices", "list", "--model", "new-model", "--json")
    assert json.loads(out)[0]["input_usd_per_mtok"] == "0.20"
    code, out, _ = run(capsys, "prices", "seed")
    assert code == 0 and "0 new price versions" in out
    assert run(capsys, "spool", "status")[1].startswith("0 records")
    for argv, message in (
        (("budgets", "set", "nope", "--monthly-limit", "1"), "no tenant"),
        (("budgets", "set", "ten_cli", "--monthly-limit", "1.0000000000001"), "pico-dollar"),
        (("credits", "grant", "ten_cli", "-1"), "positive"),
        # Beyond what a 64-bit pico-dollar column holds: a clear error naming the argument, not a crash.
        (("credits", "grant", "ten_cli", "9200000"), "amount_usd: 9200000 USD is more than the largest amount"),
        (("credits", "grant", "ten_cli", "1e999999"), "amount_usd"),
        (("budgets", "set", "ten_cli", "--monthly-limit", "9223372.036854775808"), "--monthly-limit"),
        (("budgets", "set-key", "key_cli", "--monthly-limit", "10000000"), "--monthly-limit"),
        (("prices", "add", "m", "--effective-from", "2026-05-01", "--input", "1", "--output", "1"), "time zone"),
        (
            (
                "prices",
                "add",
                "new-model",
                "--effective-from",
                "2026-05-01T00:00:00Z",
                "--input",
                "0.3",
                "--output",
                "1",
            ),
            "already has a version",
        ),
        (("usage", "list", "--start", "2026-02-02T00:00:00Z", "--end", "2026-02-01T00:00:00Z"), "after start"),
        (("invoices", "show", "424242"), "no invoice"),
    ):
        code, _, err = run(capsys, *argv)
        assert code == 1 and message in err, (argv, err)
