"""Alembic environment: one metadata for all packages (kvgate.app.load_models, the composition root)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import engine_from_config, pool, text

from kvgate.app import load_models
from kvgate.db import sync_url

config = context.config
# PostgreSQL advisory lock key held while migrating ("kvgate migrate" as a number).
MIGRATION_LOCK_KEY = 0x6B76_6761_7465_6D67
target_metadata = load_models()


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from kvgate.settings import DEFAULT_DATABASE_URL

    return sync_url(os.environ.get("KVGATE_DATABASE_URL", DEFAULT_DATABASE_URL))


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds tables instead.
        render_as_batch=True,
        compare_type=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _configure(connection=connectable)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config({"sqlalchemy.url": _url()}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            # Gateways started together (replicas, a Compose file) would race to create the same
            # tables: one migrates at a time, and the others then find the database at head.
            # Session-level, released when the connection closes.
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            connection.commit()
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
