"""The Alembic migrations build exactly the tables the models describe, on SQLite and PostgreSQL."""

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
            context = MigrationContext.configure(conn, opts={"compare_type": True, "render_as_batch": True})
            return list(compare_metadata(context, load_models()))
    finally:
        engine.dispose()


def _revision(url: str) -> str | None:
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def test_models_and_migrations_do_not_drift(gw_db_url: str) -> None:
    assert _drift(gw_db_url) == []


def test_gateway_revision_is_in_the_chain(gw_db_url: str) -> None:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(gw_db_url))
    assert script.get_revision("0001_gateway").down_revision is None
    assert _revision(gw_db_url) == script.get_current_head()


def test_downgrade_to_base_and_back(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'cycle.db'}"
    config = alembic_config(url)
    command.upgrade(config, "head")
    command.downgrade(config, "base")
    engine = sa.create_engine(sync_url(url))
    with engine.connect() as conn:
        assert "tenants" not in sa.inspect(conn).get_table_names()
    engine.dispose()
    command.upgrade(config, "head")
    assert _drift(url) == []
