"""The operator's EUR exchange rates (billing/exchange_rates.py) over the admin API and the CLI: loaded,
corrected and listed; bad input a 400 (or a one-line CLI error) naming the field, next to the same call
that is accepted. The API tests load CHF and GBP: the billing tests' database is shared, and USD rates
are what tests/billing/test_render.py finalizes against."""

from __future__ import annotations

import json

import pytest

from tests.billing.test_api import api  # noqa: F401 (the fixture)
from tests.billing.test_cli import db, run  # noqa: F401 (the fixture)


async def test_rates_are_loaded_corrected_and_listed(api):  # noqa: F811
    body = {"eur_per_unit": "0.9234", "source": "ECB euro reference rate"}
    r = await api.put("/admin/v1/exchange-rates/GBP/2026-03-31", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"currency": "GBP", "date": "2026-03-31", "eur_per_unit": "0.9234", "source": body["source"]}
    r = await api.put("/admin/v1/exchange-rates/gbp/2026-03-31", json={**body, "eur_per_unit": "1.1712"})
    assert r.status_code == 200 and r.json()["eur_per_unit"] == "1.1712"  # corrected, not a second row
    listed = (await api.get("/admin/v1/exchange-rates", params={"currency": "GBP"})).json()["data"]
    assert [(x["date"], x["eur_per_unit"]) for x in listed] == [("2026-03-31", "1.1712")]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/admin/v1/exchange-rates/EUR/2026-03-31", {}, "currency"),  # EUR into EUR is no conversion
        ("/admin/v1/exchange-rates/US/2026-03-31", {}, "currency"),
        ("/admin/v1/exchange-rates/CHF/2026-02-30", {}, "date"),
        ("/admin/v1/exchange-rates/CHF/2026-03-31", {"eur_per_unit": "-1"}, "eur_per_unit"),
        ("/admin/v1/exchange-rates/CHF/2026-03-31", {"eur_per_unit": "NaN"}, "eur_per_unit"),
        ("/admin/v1/exchange-rates/CHF/2026-03-31", {"eur_per_unit": "1e400"}, "eur_per_unit"),
        ("/admin/v1/exchange-rates/CHF/2026-03-31", {"eur_per_unit": "0.12345678901"}, "eur_per_unit"),
        ("/admin/v1/exchange-rates/CHF/2026-03-31", {"source": "ECB\x00"}, "source"),
        ("/admin/v1/exchange-rates/CHF/2026-03-31", {"source": " "}, "source"),
    ],
)
async def test_bad_rates_are_a_400_naming_the_field(api, path, body, param):  # noqa: F811
    good = {"eur_per_unit": "0.9234", "source": "ECB"}
    r = await api.put(path, json={**good, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and param in r.json()["error"]["message"]
    fixed = path.replace("/EUR/", "/CHF/").replace("/US/", "/CHF/").replace("02-30", "02-28")
    assert (await api.put(fixed, json=good)).status_code == 200  # the same call, mended, is accepted


def test_the_cli_loads_and_lists_rates(db, capsys):  # noqa: F811
    code, out, _ = run(capsys, "exchange-rates", "set", "USD", "2026-03-31", "0.9234", "--source", "ECB")
    assert code == 0 and out.strip() == "1 USD = 0.9234 EUR on 2026-03-31 (ECB)"
    code, out, _ = run(capsys, "exchange-rates", "list", "-o", "json")
    assert json.loads(out) == [{"currency": "USD", "date": "2026-03-31", "eur_per_unit": "0.9234", "source": "ECB"}]
    code, _, err = run(capsys, "exchange-rates", "set", "USD", "2026-03-31", "zero", "--source", "ECB")
    assert code != 0 and "eur_per_unit" in err
