"""How every `kvgate` listing prints: `--output table|json|csv`, one `emit` for all of them.

JSON is `model_dump(mode="json")` of the same pydantic models the admin API returns, so a script can
switch between the CLI and the API without renaming a field. CSV is a header and one line per row,
with the same field names. A table is for people: numbers right-aligned, money at fixed decimals,
`(none)` when there is nothing to show.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from enum import Enum, StrEnum
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


# Every listing takes this option: `def list_things(output: OutputOption = OutputFormat.table)`.
OutputOption = Annotated[
    OutputFormat,
    typer.Option("--output", "-o", case_sensitive=False, help="table for people; json or csv for scripts"),
]

NONE_TEXT = "(none)"
MONEY_MIN_DECIMALS = 2
MONEY_MAX_DECIMALS = 6


@dataclass(frozen=True)
class Column:
    """One column of a table: a field of the row (or a value computed from it) and how to show it.

    `money` shows the column's numbers at one fixed number of decimals (the most any cell needs,
    at least 2); by default a field whose name ends in `_usd` is money. `value` computes the cell
    from the row (e.g. a key's name looked up from its id) instead of reading `field`.
    """

    field: str
    header: str | None = None
    money: bool | None = None
    value: Callable[[Any], Any] | None = None

    @property
    def title(self) -> str:
        return self.header or self.field

    def get(self, row: Any) -> Any:
        if self.value is not None:
            return self.value(row)
        if isinstance(row, dict):
            return row.get(self.field)
        return getattr(row, self.field, None)

    def is_money(self) -> bool:
        return self.money if self.money is not None else self.field.endswith("_usd")


ColumnSpec = str | Column


def console(*, stderr: bool = False) -> Console:
    """A rich console on the current stdout (or stderr), colour only on a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, highlight=False)


def show(renderable: Any) -> None:
    """Print a rich renderable on stdout. Piped (not a terminal), lines are never wrapped nor padded,
    so a script reading a table gets whole lines without trailing blanks."""
    if sys.stdout.isatty():
        console().print(renderable)
        return
    buffer = io.StringIO()
    Console(file=buffer, width=100_000, highlight=False, no_color=True).print(renderable)
    for line in buffer.getvalue().splitlines():
        print(line.rstrip())


def emit(
    rows: Sequence[BaseModel],
    *,
    fmt: OutputFormat,
    columns: Sequence[ColumnSpec] | None = None,
    title: str | None = None,
    model: type[BaseModel] | None = None,
) -> None:
    """Print a listing. `columns` picks and orders the table's columns (default: every field);
    JSON and CSV always carry every field, named as in the model (the admin API's names).
    `model`, the rows' class, gives an empty CSV its header line."""
    if fmt == OutputFormat.json:
        print(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
    elif fmt == OutputFormat.csv:
        names = list(model.model_fields) if model is not None else _field_names(rows)
        _write_csv([row.model_dump(mode="json") for row in rows], names)
    else:
        if not rows:
            print(NONE_TEXT)
            return
        specs = [Column(c) if isinstance(c, str) else c for c in (columns or _field_names(rows))]
        show(_table(rows, specs, title))


def emit_one(
    row: BaseModel,
    *,
    fmt: OutputFormat,
    columns: Sequence[ColumnSpec] | None = None,
    title: str | None = None,
) -> None:
    """Print one object (a "show"): JSON object, CSV header + one line, or a two-column field/value table."""
    if fmt == OutputFormat.json:
        print(row.model_dump_json(indent=2))
    elif fmt == OutputFormat.csv:
        _write_csv([row.model_dump(mode="json")], list(type(row).model_fields))
    else:
        specs = [Column(c) if isinstance(c, str) else c for c in (columns or list(type(row).model_fields))]
        table = Table(
            box=box.SIMPLE, show_header=False, show_edge=False, pad_edge=False, title=title, title_justify="left"
        )
        table.add_column("field", style="bold")
        table.add_column("value")
        for spec in specs:
            value = spec.get(row)
            text = (
                _money(value, _money_decimals([value]))
                if spec.is_money() and _decimal(value) is not None
                else cell(value)
            )
            table.add_row(Text(spec.title), Text(text))
        show(table)


def cell(value: Any) -> str:
    """A value as a table shows it: datetimes in UTC to the second, lists space-separated, None blank."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%SZ" if value.utcoffset() is not None else "%Y-%m-%d %H:%M:%S")
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list | tuple | set | frozenset):
        return " ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=str)
    return str(value)


def _field_names(rows: Sequence[BaseModel]) -> list[str]:
    return list(type(rows[0]).model_fields) if rows else []


def _write_csv(records: list[dict[str, Any]], names: list[str]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(names)
    for record in records:
        writer.writerow([_csv_value(record.get(name)) for name in names])


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return value


def _decimal(value: Any) -> Decimal | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return Decimal(str(value)) if isinstance(value, int | float | Decimal | str) else None
    except InvalidOperation:
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _money(value: Any, decimals: int) -> str:
    number = _decimal(value)
    return "" if number is None else f"{number:,.{decimals}f}"


def _money_decimals(values: list[Any]) -> int:
    """The decimals a money column needs so that no cell loses a digit (2 at least, 6 at most)."""
    needed = MONEY_MIN_DECIMALS
    for value in values:
        number = _decimal(value)
        if number is not None and number.is_finite():
            exponent = number.normalize().as_tuple().exponent
            needed = max(needed, -exponent if isinstance(exponent, int) else 0)
    return min(needed, MONEY_MAX_DECIMALS)


def _table(rows: Sequence[BaseModel], specs: list[Column], title: str | None) -> Table:
    values = [[spec.get(row) for spec in specs] for row in rows]
    table = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title=title, title_justify="left", header_style="bold"
    )
    renders: list[Callable[[Any], str]] = []
    for index, spec in enumerate(specs):
        column = [row[index] for row in values]
        money = spec.is_money() and all(v is None or _decimal(v) is not None for v in column)
        numeric = money or all(v is None or _is_number(v) for v in column)
        table.add_column(spec.title, justify="right" if numeric else "left", no_wrap=numeric)
        if money:
            decimals = _money_decimals(column)
            renders.append(lambda v, d=decimals: _money(v, d))
        elif numeric:
            renders.append(lambda v: "" if v is None else f"{v:,}" if isinstance(v, int) else str(v))
        else:
            renders.append(cell)
    for row in values:
        table.add_row(*(Text(render(value)) for render, value in zip(renders, row, strict=True)))
    return table
