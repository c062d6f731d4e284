"""The real Alembic migrations against the models: no drift, and a clean downgrade/upgrade."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from kvgate.app import load_models
from kvgate.db import alembic_config, sync_url


def _drift(url: str) -> list[object]:
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, load_models()))
    finally:
        engine.dispose()


def test_models_match_migrations(db_url):
    assert _drift(db_url) == []


def test_drift_check_can_fail(db_url):
    # The same comparison notices a column the migrations do not create.
    metadata = load_models()
    table = metadata.tables["credit_grants"]
    extra = sa.Column("drift_probe", sa.Integer())
    table.append_column(extra)
    try:
        assert any("drift_probe" in str(diff) for diff in _drift(db_url))
    finally:
        table._columns.remove(extra)
    assert _drift(db_url) == []


def test_billing_downgrade_and_upgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'roundtrip.db'}"
    config = alembic_config(url)
    command.upgrade(config, "head")
    command.downgrade(config, "0001_gateway")
    engine = sa.create_engine(sync_url(url))
    try:
        assert "ledger_entries" not in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
    command.upgrade(config, "head")
    assert _drift(url) == []
