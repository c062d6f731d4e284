"""`kvgate spool status|replay`: usage spooled while the database was away."""

from __future__ import annotations

import typer

from billing.cli.common import run_billing
from billing.service import BillingService

app = typer.Typer(help="usage spooled while the database was away", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="spool")


@app.command("status")
def status() -> None:
    """Records waiting."""

    async def action(service: BillingService) -> None:
        print(f"{service.spool.pending()} records waiting in {service.spool.path}")

    run_billing(action, write=False)


@app.command("replay")
def replay() -> None:
    """Replay them now (exactly once)."""

    async def action(service: BillingService) -> None:
        result = await service.replay_spool()
        print(
            f"replayed {result.records} records from {result.files} files: "
            f"{result.applied} new, {result.corrupt} corrupt"
        )

    run_billing(action, write=True)
