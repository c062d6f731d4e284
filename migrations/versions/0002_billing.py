"""Billing tables: price catalog, ledger, budgets, invoices, credit notes, Stripe, webhooks.

Revision ID: 0002_billing
Revises: 0001_gateway

Triggers make the financial record tamper-evident at the database level: ledger
entries, invoice lines and credit notes can never be updated or deleted, and an
invoice that has left the draft state keeps its number, amounts and period.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_billing"
down_revision: str | None = "0001_gateway"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)
# Exact decimals as text (billing.models.DecimalText).
Decimal = sa.String(40)
# SQLite only auto-increments an INTEGER PRIMARY KEY.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

APPEND_ONLY_TABLES = ("ledger_entries", "invoice_lines", "credit_notes")
# Columns of an invoice fixed once it is finalized (status, payment and Stripe columns may move on).
FROZEN_INVOICE_COLUMNS = (
    "tenant_id",
    "period_start",
    "number",
    "currency",
    "requests",
    "total_cents",
    "uncached_cents",
    "finalized_at",
)


def upgrade() -> None:
    op.create_table(
        "billing_sequences",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("last_value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_billing_sequences")),
    )
    op.create_table(
        "budget_counters",
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("owner_id", sa.String(length=40), nullable=False),
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("spent_pico", sa.BigInteger(), nullable=False),
        sa.Column("reserved_pico", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("scope", "owner_id", "period", name=op.f("pk_budget_counters")),
    )
    op.create_table(
        "budget_reservations",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("api_key_id", sa.String(length=40), nullable=True),
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("amount_pico", sa.BigInteger(), nullable=False),
        sa.Column("scopes", sa.String(length=64), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_budget_reservations")),
    )
    with op.batch_alter_table("budget_reservations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_budget_reservations_created_at"), ["created_at"], unique=False)

    op.create_table(
        "price_versions",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("effective_from", Timestamp, nullable=False),
        sa.Column("input_usd_per_mtok", Decimal, nullable=False),
        sa.Column("output_usd_per_mtok", Decimal, nullable=False),
        sa.Column("cache_write_5m_multiplier", Decimal, nullable=False),
        sa.Column("cache_write_1h_multiplier", Decimal, nullable=False),
        sa.Column("cache_read_multiplier", Decimal, nullable=False),
        sa.Column("cache_write_24h_multiplier", Decimal, nullable=True),
        sa.Column("source", sa.String(length=200), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_price_versions")),
        sa.UniqueConstraint("model", "effective_from", name=op.f("uq_price_versions_model")),
    )
    op.create_table(
        "webhook_events",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("event_id", sa.String(length=128), nullable=False),
        sa.Column("event_type", sa.String(length=128), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(length=200), nullable=False),
        sa.Column("received_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_events")),
        sa.UniqueConstraint("source", "event_id", name=op.f("uq_webhook_events_source")),
    )
    op.create_table(
        "credit_grants",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("amount_pico", sa.BigInteger(), nullable=False),
        sa.Column("note", sa.String(length=500), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_credit_grants_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_credit_grants")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_credit_grants_idempotency_key")),
    )
    with op.batch_alter_table("credit_grants", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_credit_grants_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "invoices",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("period_start", sa.Date(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("number", sa.String(length=32), nullable=True),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=True),
        sa.Column("total_cents", sa.BigInteger(), nullable=True),
        sa.Column("uncached_cents", sa.BigInteger(), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("finalized_at", Timestamp, nullable=True),
        sa.Column("paid_at", Timestamp, nullable=True),
        sa.Column("payment_failed_at", Timestamp, nullable=True),
        sa.Column("stripe_invoice_id", sa.String(length=64), nullable=True),
        sa.Column("stripe_pushed_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_invoices_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invoices")),
        sa.UniqueConstraint("number", name=op.f("uq_invoices_number")),
        sa.UniqueConstraint("stripe_invoice_id", name=op.f("uq_invoices_stripe_invoice_id")),
        sa.UniqueConstraint("tenant_id", "period_start", name=op.f("uq_invoices_tenant_id")),
    )
    op.create_table(
        "ledger_entries",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("api_key_id", sa.String(length=40), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("recorded_at", Timestamp, nullable=False),
        sa.Column("billing_month", sa.Date(), nullable=False),
        sa.Column("price_version_id", Id, nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_write_5m_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_write_1h_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_write_24h_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_pico", sa.BigInteger(), nullable=False),
        sa.Column("uncached_cost_pico", sa.BigInteger(), nullable=False),
        sa.Column("ttft_ms", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=True),
        sa.ForeignKeyConstraint(
            ["price_version_id"],
            ["price_versions.id"],
            name=op.f("fk_ledger_entries_price_version_id_price_versions"),
        ),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_ledger_entries_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_entries")),
        sa.UniqueConstraint("request_id", "kind", name=op.f("uq_ledger_entries_request_id")),
    )
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_index("ix_ledger_entries_key_started", ["api_key_id", "started_at"], unique=False)
        batch_op.create_index("ix_ledger_entries_tenant_month", ["tenant_id", "billing_month"], unique=False)
        batch_op.create_index("ix_ledger_entries_tenant_started", ["tenant_id", "started_at"], unique=False)

    op.create_table(
        "stripe_customers",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("stripe_customer_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_stripe_customers_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_stripe_customers")),
        sa.UniqueConstraint("stripe_customer_id", name=op.f("uq_stripe_customers_stripe_customer_id")),
    )
    op.create_table(
        "tenant_budgets",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("monthly_limit_pico", sa.BigInteger(), nullable=True),
        sa.Column("prepaid", sa.Boolean(), nullable=False),
        sa.Column("credit_granted_pico", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_tenant_budgets_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_tenant_budgets")),
    )
    op.create_table(
        "credit_notes",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("invoice_id", Id, nullable=False),
        sa.Column("number", sa.String(length=32), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(["invoice_id"], ["invoices.id"], name=op.f("fk_credit_notes_invoice_id_invoices")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_credit_notes")),
        sa.UniqueConstraint("number", name=op.f("uq_credit_notes_number")),
    )
    with op.batch_alter_table("credit_notes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_credit_notes_invoice_id"), ["invoice_id"], unique=False)

    op.create_table(
        "invoice_lines",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("invoice_id", Id, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("category", sa.String(length=32), nullable=False),
        sa.Column("price_version_id", Id, nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("unit_price_usd_per_mtok", Decimal, nullable=False),
        sa.Column("exact_amount_pico", sa.BigInteger(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["invoice_id"], ["invoices.id"], name=op.f("fk_invoice_lines_invoice_id_invoices")),
        sa.ForeignKeyConstraint(
            ["price_version_id"],
            ["price_versions.id"],
            name=op.f("fk_invoice_lines_price_version_id_price_versions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invoice_lines")),
        sa.UniqueConstraint("invoice_id", "position", name=op.f("uq_invoice_lines_invoice_id")),
    )
    op.create_table(
        "key_budgets",
        sa.Column("api_key_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("monthly_limit_pico", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name=op.f("fk_key_budgets_api_key_id_api_keys")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_key_budgets_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("api_key_id", name=op.f("pk_key_budgets")),
    )
    op.create_table(
        "stripe_invoice_items",
        sa.Column("invoice_line_id", Id, nullable=False),
        sa.Column("stripe_invoice_item_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["invoice_line_id"],
            ["invoice_lines.id"],
            name=op.f("fk_stripe_invoice_items_invoice_line_id_invoice_lines"),
        ),
        sa.PrimaryKeyConstraint("invoice_line_id", name=op.f("pk_stripe_invoice_items")),
        sa.UniqueConstraint("stripe_invoice_item_id", name=op.f("uq_stripe_invoice_items_stripe_invoice_item_id")),
    )

    _create_triggers()


def _create_triggers() -> None:
    frozen_changed = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in FROZEN_INVOICE_COLUMNS)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE FUNCTION kvgate_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
            END $$
            """
        )
        for table in APPEND_ONLY_TABLES:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION kvgate_append_only()"
            )
        op.execute(
            f"""
            CREATE FUNCTION kvgate_invoice_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF OLD.status <> 'draft' THEN
                    IF TG_OP = 'DELETE' OR NEW.status = 'draft' OR {frozen_changed} THEN
                        RAISE EXCEPTION 'invoice % is finalized and immutable', OLD.id;
                    END IF;
                END IF;
                IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
                RETURN NEW;
            END $$
            """
        )
        op.execute(
            "CREATE TRIGGER invoices_frozen BEFORE UPDATE OR DELETE ON invoices "
            "FOR EACH ROW EXECUTE FUNCTION kvgate_invoice_frozen()"
        )
        return
    # SQLite spells IS DISTINCT FROM as IS NOT.
    sqlite_changed = frozen_changed.replace("IS DISTINCT FROM", "IS NOT")
    for table in APPEND_ONLY_TABLES:
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only: {action} refused'); END"
            )
    op.execute(
        "CREATE TRIGGER invoices_frozen BEFORE UPDATE ON invoices "
        f"WHEN OLD.status <> 'draft' AND (NEW.status = 'draft' OR {sqlite_changed}) "
        "BEGIN SELECT RAISE(ABORT, 'invoice is finalized and immutable'); END"
    )
    op.execute(
        "CREATE TRIGGER invoices_no_delete BEFORE DELETE ON invoices WHEN OLD.status <> 'draft' "
        "BEGIN SELECT RAISE(ABORT, 'invoice is finalized and immutable'); END"
    )


def _drop_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER invoices_frozen ON invoices")
        for table in APPEND_ONLY_TABLES:
            op.execute(f"DROP TRIGGER {table}_append_only ON {table}")
        op.execute("DROP FUNCTION kvgate_invoice_frozen()")
        op.execute("DROP FUNCTION kvgate_append_only()")
        return
    op.execute("DROP TRIGGER invoices_frozen")
    op.execute("DROP TRIGGER invoices_no_delete")
    for table in APPEND_ONLY_TABLES:
        for action in ("update", "delete"):
            op.execute(f"DROP TRIGGER {table}_no_{action}")


def downgrade() -> None:
    _drop_triggers()
    op.drop_table("stripe_invoice_items")
    op.drop_table("key_budgets")
    op.drop_table("invoice_lines")
    with op.batch_alter_table("credit_notes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_credit_notes_invoice_id"))

    op.drop_table("credit_notes")
    op.drop_table("tenant_budgets")
    op.drop_table("stripe_customers")
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index("ix_ledger_entries_tenant_started")
        batch_op.drop_index("ix_ledger_entries_tenant_month")
        batch_op.drop_index("ix_ledger_entries_key_started")

    op.drop_table("ledger_entries")
    op.drop_table("invoices")
    with op.batch_alter_table("credit_grants", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_credit_grants_tenant_id"))

    op.drop_table("credit_grants")
    op.drop_table("webhook_events")
    op.drop_table("price_versions")
    with op.batch_alter_table("budget_reservations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_budget_reservations_created_at"))

    op.drop_table("budget_reservations")
    op.drop_table("budget_counters")
    op.drop_table("billing_sequences")
