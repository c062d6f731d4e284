"""`kvgate prices list|seed|add`: the price catalog."""

from __future__ import annotations

import sys
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any

import typer

from billing import catalog, operations
from billing.cli.common import ModelOption, run_billing
from billing.prices import PRICE_FIELDS, PriceChange
from billing.schemas import PriceOut, price_text
from billing.service import BillingService
from kvgate.cli_dates import FORMATS, parse_when
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit

app = typer.Typer(help="the price catalog", no_args_is_help=True)

# Prices and multipliers at fixed decimals, like money (a column shares one number of decimals).
COLUMNS = [
    "id",
    "model",
    "effective_from",
    Column("input_usd_per_mtok", "input $/Mtok", money=True),
    Column("output_usd_per_mtok", "output $/Mtok", money=True),
    Column("cache_write_5m_multiplier", "write 5m x", money=True),
    Column("cache_write_30m_multiplier", "write 30m x", money=True),
    Column("cache_write_1h_multiplier", "write 1h x", money=True),
    Column("cache_write_12h_multiplier", "write 12h x", money=True),
    Column("cache_write_24h_multiplier", "write 24h x", money=True),
    Column("cache_read_multiplier", "read x", money=True),
]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="prices")


@app.command("list")
def list_prices(model: ModelOption = None, output: OutputOption = OutputFormat.table) -> None:
    """Price versions (USD per million tokens; cache multipliers apply to the input price)."""

    async def load(service: BillingService) -> list[PriceOut]:
        async with service.sessions() as session:
            return [PriceOut.of(v) for v in await catalog.list_versions(session=session, model=model)]

    emit(run_billing(load, write=False), fmt=output, columns=COLUMNS, model=PriceOut)


@app.command("seed")
def seed(
    file: Annotated[Path | None, typer.Option(help="default KVGATE_PRICES_FILE or billing/prices.toml")] = None,
) -> None:
    """Load a TOML price file (idempotent; new prices become new versions)."""

    async def action(service: BillingService) -> None:
        path = file or service.settings.prices_file
        async with service.sessions() as session:
            result = await operations.seed_prices(session=session, path=path)
        print(f"{len(result.created)} new price versions, {result.unchanged} unchanged ({path})")

    run_billing(action, write=True, seed=False)


def _decimal(text: str | None, name: str) -> Decimal | None:
    if text is None or text.strip().lower() == "none":
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"--{name.replace('_', '-')}: not a decimal: {text!r}") from None
    return value


def _option(name: str, text: str) -> Any:
    flag = "--" + name.removesuffix("_usd_per_mtok").replace("_", "-")
    return typer.Option(flag, metavar="DECIMAL", help=text)


PriceOption = Annotated[str | None, _option("input_usd_per_mtok", "USD per million input tokens")]
OutputPriceOption = Annotated[str | None, _option("output_usd_per_mtok", "USD per million output tokens")]
_MULTIPLIER_HELP = "multiplier on the input price"


@app.command("add")
def add(
    model: Annotated[str, typer.Argument(help="the model's name ('*' prices every model without its own)")],
    effective_from: Annotated[
        datetime, typer.Option("--effective-from", parser=parse_when, metavar="WHEN", help=FORMATS)
    ],
    input_usd_per_mtok: PriceOption = None,
    output_usd_per_mtok: OutputPriceOption = None,
    cache_write_5m_multiplier: Annotated[str | None, _option("cache_write_5m_multiplier", _MULTIPLIER_HELP)] = None,
    cache_write_30m_multiplier: Annotated[str | None, _option("cache_write_30m_multiplier", _MULTIPLIER_HELP)] = None,
    cache_write_1h_multiplier: Annotated[str | None, _option("cache_write_1h_multiplier", _MULTIPLIER_HELP)] = None,
    cache_write_12h_multiplier: Annotated[str | None, _option("cache_write_12h_multiplier", _MULTIPLIER_HELP)] = None,
    cache_write_24h_multiplier: Annotated[
        str | None, _option("cache_write_24h_multiplier", "offer 24h retention at this multiplier; 'none' stops it")
    ] = None,
    cache_read_multiplier: Annotated[str | None, _option("cache_read_multiplier", _MULTIPLIER_HELP)] = None,
) -> None:
    """Add a price version (a change never edits an old one).

    What it does not set is carried over from the model's version before it, with a warning naming
    those fields; a model's first version needs --input and --output and takes the default multipliers.
    (--output here is the output price: this command prints one version, not a listing.)
    """
    texts = {
        "input_usd_per_mtok": input_usd_per_mtok,
        "output_usd_per_mtok": output_usd_per_mtok,
        "cache_write_5m_multiplier": cache_write_5m_multiplier,
        "cache_write_30m_multiplier": cache_write_30m_multiplier,
        "cache_write_1h_multiplier": cache_write_1h_multiplier,
        "cache_write_12h_multiplier": cache_write_12h_multiplier,
        "cache_write_24h_multiplier": cache_write_24h_multiplier,
        "cache_read_multiplier": cache_read_multiplier,
    }
    assert set(texts) == set(PRICE_FIELDS)
    given = {name: _decimal(text, name) for name, text in texts.items() if text is not None}
    change = PriceChange(model=model, effective_from=effective_from, given=given)

    async def action(service: BillingService) -> operations.AddedPrice:
        async with service.sessions() as session:
            return await operations.add_price(session=session, change=change, source="cli")

    added = run_billing(action, write=True)
    if added.carried_over:
        version = added.version
        carried = ", ".join(f"{name}={price_text(getattr(version, name))}" for name in added.carried_over)
        print(f"warning: carried over from price version {added.carried_from}: {carried}", file=sys.stderr)
    version = added.version
    print(f"price version {version.id}: {version.model} from {version.effective_from.isoformat()}")
    emit([PriceOut.of(version)], fmt=OutputFormat.table, columns=COLUMNS)
