"""`kvgate budgets show|set|set-key`: spend limits."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import BaseModel

from billing import operations
from billing.budgets import BudgetStatus
from billing.cli.common import LimitOption, limit_pico, run_billing
from billing.schemas import BudgetOut, KeyBudgetOut
from billing.service import BillingService
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit, emit_one

app = typer.Typer(help="spend limits", no_args_is_help=True)


class LimitRow(BaseModel):
    """One line of the `budgets show` table (the table only: JSON and CSV are the API's BudgetOut)."""

    limit: str
    period: str
    api_key_id: str | None = None
    name: str | None = None
    limit_usd: str | None
    spent_usd: str
    reserved_usd: str
    remaining_usd: str | None


COLUMNS = [
    "limit",
    "period",
    Column("name", "key"),
    Column("api_key_id", "key id"),
    Column("limit_usd", "limit $"),
    Column("spent_usd", "spent $"),
    Column("reserved_usd", "reserved $"),
    Column("remaining_usd", "remaining $"),
]


def limit_rows(budget: BudgetOut) -> list[LimitRow]:
    """The tenant's month, its prepaid credit (when prepaid), then each key's own month."""
    rows = [LimitRow(limit="tenant month", **budget.month.model_dump())]
    if budget.prepaid:
        rows.append(LimitRow(limit="prepaid credit", **budget.credit.model_dump()))
    for key in budget.keys:
        rows.append(
            LimitRow(
                limit="key month" + (" (revoked)" if key.revoked else ""),
                period=budget.month.period,
                api_key_id=key.api_key_id,
                name=key.name,
                limit_usd=key.monthly_limit_usd,
                spent_usd=key.spent_usd,
                reserved_usd=key.reserved_usd,
                remaining_usd=key.remaining_usd,
            )
        )
    return rows


def show_budget(budget: BudgetOut, output: OutputFormat) -> None:
    if output != OutputFormat.table:
        emit_one(budget, fmt=output)
        return
    title = f"{budget.tenant_id}: limits this month (no limit where blank)"
    emit(limit_rows(budget), fmt=output, columns=COLUMNS, title=title)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="budgets")


@app.command("show")
def show(tenant_id: str, output: OutputOption = OutputFormat.table) -> None:
    """A tenant's limits, spend and reservations this month, with each key's own limit and spend.

    JSON and CSV: the admin API's GET /tenants/{id}/budget.
    """

    async def load(service: BillingService) -> BudgetStatus:
        async with service.sessions() as session:
            return await operations.budget_status(session=session, tenant_id=tenant_id)

    show_budget(BudgetOut.of(run_billing(load, write=False)), output)


@app.command("set")
def set_limit(
    tenant_id: str,
    monthly_limit: LimitOption,
    prepaid: Annotated[
        bool | None, typer.Option("--prepaid/--no-prepaid", help="also require unspent prepaid credit")
    ] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Set a tenant's monthly limit and/or prepaid mode; prints the budget as `show` does."""
    limit = limit_pico(monthly_limit)

    async def action(service: BillingService) -> BudgetStatus:
        async with service.sessions() as session:
            return await operations.set_tenant_budget(
                session=session, tenant_id=tenant_id, monthly_limit_pico=limit, prepaid=prepaid
            )

    show_budget(BudgetOut.of(run_billing(action, write=True)), output)


@app.command("set-key")
def set_key(key_id: str, monthly_limit: LimitOption, output: OutputOption = OutputFormat.table) -> None:
    """Set an API key's own monthly limit (the tenant's limits still apply)."""
    limit = limit_pico(monthly_limit)

    async def action(service: BillingService) -> KeyBudgetOut:
        async with service.sessions() as session:
            budget = await operations.set_key_budget(session=session, key_id=key_id, monthly_limit_pico=limit)
        return KeyBudgetOut.of(budget)

    out = run_billing(action, write=True)
    if output != OutputFormat.table:
        emit_one(out, fmt=output)
        return
    print(f"key {key_id}: monthly limit {monthly_limit}")
