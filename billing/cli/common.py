"""What the billing commands share: the billing service on the database, usage filters, limits.

Output (`--output`), dates (`--start/--end/--month`), `-v` and one-line errors come from the CLI
kit (kvgate.cli_output, cli_dates, cli_database, cli_errors).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, TypeVar

import typer

from billing.money import parse_usd
from billing.service import BillingService
from billing.settings import BillingSettings
from billing.usage_queries import UsageFilter
from kvgate.cli_database import Sessions, run_on_database
from kvgate.cli_dates import time_range

T = TypeVar("T")

TenantOption = Annotated[str | None, typer.Option("--tenant", help="only this tenant (id)")]
KeyOption = Annotated[str | None, typer.Option("--key", help="only this API key (id)")]
ModelOption = Annotated[str | None, typer.Option("--model", help="only this model")]
LimitOption = Annotated[str, typer.Option("--monthly-limit", help="USD, or 'none' for no limit")]


def run_billing(action: Callable[[BillingService], Awaitable[T]], *, write: bool, seed: bool | None = None) -> T:
    """Run `action` with the billing service on the configured database.

    write=False (list, show, summary, export): never creates a database (see kvgate.cli_database)
    and does not seed the price catalog. write=True migrates (creating a SQLite file if need be)
    and seeds the catalog from the price file unless `seed` is False.
    """

    async def start(sessions: Sessions) -> T:
        settings = BillingSettings()
        if "spool_path" not in settings.model_fields_set:
            from billing.hooks import default_spool_path

            settings = settings.model_copy(update={"spool_path": default_spool_path(_url())})
        service = await BillingService.start(sessions=sessions, settings=settings, seed=write and seed is not False)
        return await action(service)

    return run_on_database(start, write=write)


def _url() -> str:
    from kvgate.settings import KvgateSettings

    return KvgateSettings().database_url


def usage_filter(
    *,
    tenant: str | None,
    key: str | None,
    model: str | None,
    start: datetime | None,
    end: datetime | None,
    month: str | None,
) -> UsageFilter:
    """The ledger filter of the usage commands' options (`--month` or `--start/--end`)."""
    start, end = time_range(start=start, end=end, month=month)
    return UsageFilter(tenant_id=tenant, api_key_id=key, model=model, start=start, end=end)


def limit_pico(text: str) -> int | None:
    """A monthly limit as given: USD, or 'none' for no limit."""
    return None if text.strip().lower() == "none" else parse_usd(text, field="--monthly-limit")
