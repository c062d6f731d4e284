"""`kvgate usage list|summary|export|reverse`: the usage ledger."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from billing import operations
from billing.cli.common import KeyOption, ModelOption, TenantOption, run_billing, usage_filter
from billing.csv_export import iter_csv
from billing.money import format_usd_exact
from billing.schemas import SummaryOut, UsageOut
from billing.service import BillingService
from billing.usage_queries import UsageFilter, iter_usage, key_names, list_usage, summarize
from kvgate.cli_dates import EndOption, MonthOption, StartOption
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit
from kvgate.usage import TTL_CLASSES

app = typer.Typer(help="the usage ledger", no_args_is_help=True)


class GroupBy(StrEnum):
    day = "day"
    model = "model"
    key = "key"


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="usage")


def _writes(row: UsageOut | SummaryOut) -> int:
    return sum(getattr(row, f"{t.category.value}_tokens") for t in TTL_CLASSES)


def list_columns(names: dict[str, str]) -> list[Any]:
    """The ledger table's columns; keys by name (the id in JSON and CSV)."""
    key = Column("api_key_id", "key", value=lambda r: names.get(r.api_key_id, r.api_key_id))
    return [*LIST_COLUMNS[:3], key, *LIST_COLUMNS[3:]]


LIST_COLUMNS = [
    "id",
    "started_at",
    "request_id",
    "model",
    "status",
    Column("input_tokens", "input"),
    Column("cache_writes", "cache writes", value=_writes),
    Column("cache_read_tokens", "cache read"),
    Column("output_tokens", "output"),
    Column("cost_usd", "cost $"),
]


@app.command("list")
def list_entries(
    tenant: TenantOption = None,
    key: KeyOption = None,
    model: ModelOption = None,
    start: StartOption = None,
    end: EndOption = None,
    month: MonthOption = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="at most this many entries")] = 100,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Ledger entries, oldest first (JSON and CSV: the admin API's GET /usage fields)."""
    where = usage_filter(tenant=tenant, key=key, model=model, start=start, end=end, month=month)

    async def load(service: BillingService) -> tuple[list[UsageOut], dict[str, str]]:
        async with service.sessions() as session:
            rows = [UsageOut.of(r) for r in await list_usage(session=session, where=where, limit=limit)]
            return rows, await key_names(session=session, key_ids=(r.api_key_id for r in rows))

    rows, names = run_billing(load, write=False)
    emit(rows, fmt=output, columns=list_columns(names), model=UsageOut)


def summary_columns(rows: list[SummaryOut], groups: list[str]) -> list[Any]:
    """The table's columns: the groups, then counts (a write column only for TTL classes with
    writes), then hit rate and money."""
    columns: list[Any] = []
    if "day" in groups:
        columns.append("day")
    if "model" in groups:
        columns.append("model")
    if "key" in groups:
        columns.append(Column("api_key_name", "key", value=lambda r: r.api_key_name or r.api_key_id or "(no key)"))
        columns.append(Column("api_key_id", "key id"))
    columns += [Column("requests"), Column("input_tokens", "input")]
    for ttl in TTL_CLASSES:
        name = f"{ttl.category.value}_tokens"
        if any(getattr(r, name) for r in rows):
            columns.append(Column(name, f"write {ttl.name}"))
    columns += [
        Column("cache_read_tokens", "cache read"),
        Column("output_tokens", "output"),
        Column("hit_rate", "hit %", value=lambda r: None if r.hit_rate is None else round(r.hit_rate * 100, 1)),
        Column("cost_usd", "cost $"),
        Column("uncached_cost_usd", "uncached $"),
        Column("saved_usd", "saved $"),
    ]
    return columns


@app.command("summary")
def summary(
    group_by: Annotated[
        list[GroupBy] | None,
        typer.Option("--group-by", "-g", case_sensitive=False, help="repeat for several, e.g. -g model -g key"),
    ] = None,
    tenant: TenantOption = None,
    key: KeyOption = None,
    model: ModelOption = None,
    start: StartOption = None,
    end: EndOption = None,
    month: MonthOption = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Totals by day (the default), model and/or key, with hit rate and what the cache saved.

    JSON and CSV: the admin API's GET /usage/summary rows.
    """
    where = usage_filter(tenant=tenant, key=key, model=model, start=start, end=end, month=month)
    groups = [g.value for g in group_by or [GroupBy.day]]

    async def load(service: BillingService) -> list[SummaryOut]:
        async with service.sessions() as session:
            return [SummaryOut.of(r) for r in await summarize(session=session, where=where, group_by=groups)]

    rows = run_billing(load, write=False)
    emit(rows, fmt=output, columns=summary_columns(rows, groups), model=SummaryOut)


@app.command("export")
def export(
    tenant: TenantOption = None,
    key: KeyOption = None,
    model: ModelOption = None,
    start: StartOption = None,
    end: EndOption = None,
    month: MonthOption = None,
    out: Annotated[Path | None, typer.Option(help="file to write (default: standard output)")] = None,
) -> None:
    """Every matching entry as CSV (the admin API's GET /usage/export.csv)."""
    where = usage_filter(tenant=tenant, key=key, model=model, start=start, end=end, month=month)
    count = run_billing(lambda service: _export(service, where, out), write=False)
    if out is not None:
        print(f"wrote {count} entries to {out}")


async def _export(service: BillingService, where: UsageFilter, out: Path | None) -> int:
    async with service.sessions() as session:
        rows = [row async for row in iter_usage(session=session, where=where)]
    if out is None:
        for chunk in iter_csv(rows):
            sys.stdout.write(chunk)
    else:
        with out.open("w", newline="") as fh:
            for chunk in iter_csv(rows):
                fh.write(chunk)
    return len(rows)


@app.command("reverse")
def reverse(
    request_id: str,
    reason: Annotated[str, typer.Option(help="why (kept on the reversal entry)")],
) -> None:
    """Cancel a request's charge with a reversal entry (idempotent)."""

    async def action(service: BillingService) -> None:
        async with service.sessions() as session:
            result = await operations.reverse_usage(session=session, request_id=request_id, reason=reason)
        state = "reversed" if result.inserted else "already reversed"
        print(f"{request_id}: {state}, {format_usd_exact(result.cost_pico)} USD in {result.billing_month:%Y-%m}")

    run_billing(action, write=True)
