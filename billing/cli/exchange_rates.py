"""`kvgate exchange-rates set|list`: the dated EUR rates invoices state their VAT in (billing/exchange_rates.py)."""

from __future__ import annotations

from datetime import date
from typing import Annotated

import typer

from billing import exchange_rates
from billing.api.exchange_rates import ExchangeRateOut
from billing.cli.common import run_billing
from billing.service import BillingService
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit

app = typer.Typer(help="EUR exchange rates for the VAT in EUR on invoices", no_args_is_help=True)
COLUMNS = ["currency", "date", Column("eur_per_unit", "EUR per unit"), "source"]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="exchange-rates")


@app.command("set")
def set_rate(
    currency: Annotated[str, typer.Argument(help="ISO 4217, e.g. USD")],
    on: Annotated[str, typer.Argument(help="the rate's date, YYYY-MM-DD")],
    eur_per_unit: Annotated[str, typer.Argument(help="EUR per one unit, e.g. 0.9234")],
    source: Annotated[str, typer.Option(help="who published it, e.g. 'ECB euro reference rate'")],
) -> None:
    """Load (or correct) a rate; finalization takes the latest one dated on or before the issue date."""
    code = exchange_rates.parse_currency(currency)
    rate = exchange_rates.parse_rate(eur_per_unit)
    try:
        day = date.fromisoformat(on)
    except ValueError:
        raise typer.BadParameter("YYYY-MM-DD", param_hint="ON") from None

    async def action(service: BillingService) -> None:
        async with service.sessions() as session:
            await exchange_rates.set_rate(session, currency=code, on=day, eur_per_unit=rate, source=source)
            await session.commit()
        print(f"1 {code.upper()} = {rate} EUR on {day.isoformat()} ({source.strip()})")

    run_billing(action, write=True)


@app.command("list")
def list_rates(
    currency: Annotated[str | None, typer.Option(help="only this currency's")] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Loaded rates, newest first (JSON and CSV: the admin API's GET /exchange-rates fields)."""
    code = exchange_rates.parse_currency(currency) if currency else None

    async def load(service: BillingService) -> list[ExchangeRateOut]:
        async with service.sessions() as session:
            return [ExchangeRateOut.of(r) for r in await exchange_rates.list_rates(session, currency=code)]

    emit(run_billing(load, write=False), fmt=output, columns=COLUMNS, model=ExchangeRateOut)
