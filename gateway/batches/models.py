"""The batch tables (migration 0009): batches, their items (one per request, with its result) and files.

Every row belongs to a tenant (ON DELETE CASCADE) and every query is scoped by tenant: another
tenant's id is as unknown as one that never existed.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from kvgate.db import Base, UTCDateTime, utcnow

# A batch's state; each API shows it in its own words (gateway/batches/shapes.py).
IN_PROGRESS = "in_progress"
CANCELING = "canceling"
ENDED = "ended"

# An item's state: waiting, claimed by a runner, or one of the four results.
PENDING = "pending"
RUNNING = "running"
SUCCEEDED = "succeeded"
ERRORED = "errored"
CANCELED = "canceled"
EXPIRED = "expired"
RESULTS = (SUCCEEDED, ERRORED, CANCELED, EXPIRED)

ANTHROPIC = "anthropic"
OPENAI = "openai"


class Batch(Base):
    __tablename__ = "batches"
    __table_args__ = (
        Index("ix_batches_tenant_created", "tenant_id", "created_at"),
        Index("ix_batches_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[str] = mapped_column(String(40))
    api: Mapped[str] = mapped_column(String(16))  # ANTHROPIC or OPENAI
    endpoint: Mapped[str] = mapped_column(String(64))  # /v1/messages or /v1/chat/completions
    status: Mapped[str] = mapped_column(String(16), default=IN_PROGRESS)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    request_count: Mapped[int] = mapped_column(Integer)
    # OpenAI: the uploaded input file, the completion window and the metadata (JSON text).
    input_file_id: Mapped[str | None] = mapped_column(String(64), default=None)
    completion_window: Mapped[str | None] = mapped_column(String(16), default=None)
    metadata_json: Mapped[str | None] = mapped_column(Text, default=None)


class BatchItem(Base):
    """One request of a batch: its params, its state and, once it has one, its result line.

    request_id is the id of the item's current attempt (its usage record's and ledger entry's id),
    set before the engine starts on it: an attempt whose usage was recorded is never run again.
    """

    __tablename__ = "batch_items"
    __table_args__ = (
        Index("ix_batch_items_batch_status", "batch_id", "status"),
        Index("ix_batch_items_batch_custom_id", "batch_id", "custom_id", unique=True),
    )

    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(String(64))
    params_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    request_id: Mapped[str | None] = mapped_column(String(64), default=None)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    # The item's result: Anthropic's {"type": ..., "message"|"error": ...}, or OpenAI's output line's
    # {"response": ..., "error": ...}; JSON text.
    result_json: Mapped[str | None] = mapped_column(Text, default=None)


class BatchFile(Base):
    """An OpenAI file: an uploaded input (its bytes here), or a batch's output or error file, whose
    content is made from the batch's items when it is read."""

    __tablename__ = "batch_files"
    __table_args__ = (Index("ix_batch_files_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))  # batch, batch_output
    filename: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    content: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    # Output files: the batch, and which lines (OUTPUT: the succeeded, ERRORS: the rest).
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"), default=None)
    kind: Mapped[str] = mapped_column(String(16), default="input")


OUTPUT = "output"
ERRORS = "errors"
