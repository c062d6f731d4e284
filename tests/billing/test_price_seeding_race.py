"""Gateways starting together seed the same price file at once: each start succeeds, one version is stored."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from billing.catalog import PriceConflictError
from billing.hooks import _prepare_catalog
from billing.settings import BillingSettings
from kvgate.db import sync_url


def test_concurrent_seeding_of_one_file_stores_one_version_and_every_start_succeeds(
    postgres_url: str, tmp_path: Path
) -> None:
    model = f"race-{uuid.uuid4().hex[:8]}"
    prices = tmp_path / "prices.toml"
    prices.write_text(
        f'[[prices]]\nmodel = "{model}"\neffective_from = 2026-01-01T00:00:00Z\n'
        "input_usd_per_mtok = 3\noutput_usd_per_mtok = 15\n"
    )
    settings = BillingSettings(prices_file=prices)
    starters = 4
    together = threading.Barrier(starters)

    def start() -> list[str]:
        together.wait(timeout=60)
        return [v.model for v in _prepare_catalog(postgres_url, settings).versions()]

    with ThreadPoolExecutor(starters) as pool:
        books = list(pool.map(lambda _: start(), range(starters)))
    assert all(book.count(model) == 1 for book in books)
    engine = sa.create_engine(sync_url(postgres_url))
    try:
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT COUNT(*) FROM price_versions WHERE model = :m"), {"m": model})
            assert stored.scalar_one() == 1
    finally:
        engine.dispose()

    # The paired negative: a file that really contradicts the catalog still fails, after its retries.
    prices.write_text(prices.read_text().replace("input_usd_per_mtok = 3", "input_usd_per_mtok = 4"))
    with pytest.raises(PriceConflictError, match="differs from the stored version"):
        _prepare_catalog(postgres_url, settings)
