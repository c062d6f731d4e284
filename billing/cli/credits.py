"""`kvgate credits grant`: prepaid credit."""

from __future__ import annotations

from typing import Annotated

import typer

from billing import operations
from billing.cli.common import run_billing
from billing.money import format_usd_exact, parse_usd
from billing.service import BillingService

app = typer.Typer(help="prepaid credit", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="credits")


@app.command("grant")
def grant(
    tenant_id: str,
    amount_usd: Annotated[str, typer.Argument(help="USD, e.g. 100")],
    note: Annotated[str, typer.Option(help="kept with the grant")] = "",
    idempotency_key: Annotated[str | None, typer.Option(help="a retry with the same key grants once")] = None,
) -> None:
    """Add prepaid credit to a tenant."""
    amount_pico = parse_usd(amount_usd, field="amount_usd")

    async def action(service: BillingService) -> None:
        async with service.sessions() as session:
            made, created = await operations.grant_credit(
                session=session,
                tenant_id=tenant_id,
                amount_pico=amount_pico,
                note=note,
                idempotency_key=idempotency_key,
            )
        state = "granted" if created else "already granted"
        print(f"{state}: {format_usd_exact(made.amount_pico)} USD to {tenant_id} (grant {made.id})")

    run_billing(action, write=True)
