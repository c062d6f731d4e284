"""The CLI kit every package's commands use (kvgate.cli_output, cli_dates, cli_errors), driven through
a small command built with it, as a package builds its own."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import typer
from pydantic import BaseModel
from typer.testing import CliRunner, Result

from kvgate.cli_dates import EndOption, MonthOption, StartOption, month_range, parse_when, time_range
from kvgate.cli_errors import UserErrorGroup
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit, emit_one
from kvgate.errors import NotFoundError


class Line(BaseModel):
    model: str
    input_tokens: int
    cost_usd: Decimal
    at: datetime


LINES = [
    Line(model="small", input_tokens=1_234_567, cost_usd=Decimal("3"), at=datetime(2026, 11, 2, 9, 30, tzinfo=UTC)),
    Line(model="large", input_tokens=5, cost_usd=Decimal("0.125"), at=datetime(2026, 11, 3, tzinfo=UTC)),
]

app = typer.Typer(cls=UserErrorGroup)


@app.callback()
def _root() -> None:
    pass


@app.command("lines")
def lines(
    output: OutputOption = OutputFormat.table,
    start: StartOption = None,
    end: EndOption = None,
    month: MonthOption = None,
    empty: bool = False,
) -> None:
    since, until = time_range(start=start, end=end, month=month)
    print(f"range {since and since.isoformat()} {until and until.isoformat()}", file=__import__("sys").stderr)
    emit([] if empty else LINES, fmt=output, columns=["model", "input_tokens", "cost_usd"], model=Line)


@app.command("one")
def one(output: OutputOption = OutputFormat.table) -> None:
    emit_one(LINES[1], fmt=output, columns=["model", Column("cost_usd", header="cost")])


@app.command("missing")
def missing() -> None:
    raise NotFoundError("tenant 'ten_x' not found")


def run(*argv: str) -> Result:
    return CliRunner().invoke(app, list(argv), env={"COLUMNS": "300"})  # usage errors on one line


def test_a_listing_in_each_format() -> None:
    table = run("lines").stdout.splitlines()
    assert table[0].split() == ["model", "input_tokens", "cost_usd"]
    # Numbers right-aligned (they end in the same column); money at one fixed number of decimals.
    small, large = (line for line in table if line.startswith(("small", "large")))
    assert small.split() == ["small", "1,234,567", "3.000"] and large.split() == ["large", "5", "0.125"]
    assert small.index("1,234,567") + len("1,234,567") == large.index(" 5 ") + 2
    assert len(small) == len(large) and not small.endswith(" ")

    as_json = json.loads(run("lines", "-o", "json").stdout)
    assert as_json == [line.model_dump(mode="json") for line in LINES]
    assert list(as_json[0]) == ["model", "input_tokens", "cost_usd", "at"]  # every field, the model's names

    rows = list(csv.DictReader(io.StringIO(run("lines", "--output", "csv").stdout)))
    assert [dict(r) for r in rows] == [{k: str(v) for k, v in line.model_dump(mode="json").items()} for line in LINES]
    assert run("lines", "-o", "xml").exit_code == 2  # an unknown format is a usage error


def test_an_empty_listing() -> None:
    assert run("lines", "--empty").stdout == "(none)\n"
    assert run("lines", "--empty", "-o", "json").stdout.strip() == "[]"
    assert run("lines", "--empty", "-o", "csv").stdout == "model,input_tokens,cost_usd,at\n"


def test_one_object() -> None:
    lines = run("one").stdout.splitlines()
    assert [line.split() for line in lines] == [["model", "large"], ["cost", "0.125"]]
    assert json.loads(run("one", "-o", "json").stdout)["cost_usd"] == "0.125"
    assert run("one", "-o", "csv").stdout.splitlines()[0] == "model,input_tokens,cost_usd,at"


def test_dates_on_the_command_line() -> None:
    assert "range 2026-11-01T00:00:00+00:00 None" in run("lines", "--start", "2026-11-01").stderr
    assert "range 2026-11-01T08:00:00+00:00 None" in run("lines", "--start", "2026-11-01T09:00+01:00").stderr
    assert "range 2026-11-01T09:00:00+00:00 None" in run("lines", "--start", "2026-11-01T09:00Z").stderr
    assert "range 2026-12-01T00:00:00+00:00 2027-01-01T00:00:00+00:00" in run("lines", "--month", "2026-12").stderr
    refused = run("lines", "--start", "2026-11-01T09:00")
    assert refused.exit_code == 2 and "no time zone" in refused.output and "--start" in refused.output
    assert run("lines", "--month", "2026-13").exit_code == 2
    both = run("lines", "--month", "2026-11", "--end", "2026-12-01")
    assert both.exit_code == 1 and both.stderr == "error: give --month, or --start/--end, not both\n"
    backwards = run("lines", "--start", "2026-11-02", "--end", "2026-11-01")
    assert backwards.exit_code == 1 and "must be after --start" in backwards.stderr


def test_date_parsing() -> None:
    assert parse_when("2026-11-01") == datetime(2026, 11, 1, tzinfo=UTC)
    assert parse_when(" 2026-11-01T23:30:00-02:00 ") == datetime(2026, 11, 2, 1, 30, tzinfo=UTC)
    assert month_range("2026-02") == (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))
    assert time_range() == (None, None)
    for bad in ("2026-02-30", "yesterday", "2026-11-01 10:00", ""):
        with pytest.raises(ValueError):
            parse_when(bad)
    for bad in ("2026-00", "2026-1", "26-11", "2026-11-01"):
        with pytest.raises(ValueError):
            month_range(bad)


def test_a_user_error_is_one_line_and_exit_1() -> None:
    result = run("missing")
    assert result.exit_code == 1 and result.stderr == "error: tenant 'ten_x' not found\n" and result.stdout == ""
