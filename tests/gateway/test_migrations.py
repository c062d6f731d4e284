"""The Alembic migrations build exactly the tables the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from kvgate.app import load_models
from kvgate.db import alembic_config, sync_url
from tests.gateway.harness import pg_reachable, postgres_database


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


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_usage_placement_columns_are_added_and_filled(backend: str, tmp_path) -> None:
    """0007: records from before name the embedded engine; the columns stay nullable; downgrade drops them."""
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / 'placement.db'}"
        else:
            if not pg_reachable():
                pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
            url = stack.enter_context(postgres_database("kvgate_placement_test"))
        config = alembic_config(url)
        command.upgrade(config, "0006_cache_ttl_classes")
        engine = sa.create_engine(sync_url(url))
        stack.callback(engine.dispose)
        row = {
            "request_id": "req_before",
            "tenant_id": "ten_x",
            "api_key_id": "key_x",
            "model": "m",
            "endpoint": "messages",
            "started_at": datetime.now(UTC),
            "input_tokens": 1,
            "cache_write_5m_tokens": 0,
            "cache_write_1h_tokens": 0,
            "cache_write_24h_tokens": 0,
            "cache_read_tokens": 0,
            "output_tokens": 1,
            "latency_ms": 1,
            "status": "ok",
        }
        insert = f"INSERT INTO usage_records ({', '.join(row)}) VALUES ({', '.join(':' + k for k in row)})"
        with engine.begin() as conn:
            conn.execute(sa.text(insert), row)
        command.upgrade(config, "head")
        with engine.begin() as conn:
            conn.execute(sa.text(insert), {**row, "request_id": "req_after"})
            stored = {
                r["request_id"]: (r["backend"], r["engine_id"], r["predicted_cached_tokens"])
                for r in conn.execute(sa.text("SELECT * FROM usage_records")).mappings()
            }
        assert stored == {"req_before": ("embedded", "embedded", None), "req_after": (None, None, None)}
        assert _drift(url) == []
        command.downgrade(config, "0006_cache_ttl_classes")
        with engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("usage_records")}
        assert "backend" not in columns and "request_id" in columns
