"""The dashboard's tables: single-use login links and browser sessions. Migration 0003_dashboard creates them.

Only the SHA-256 of a link's or session's token is stored, as for API keys.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from kvgate.db import Base, UTCDateTime, utcnow


class LoginLink(Base):
    """A magic link: valid until expires_at, spent by its first use."""

    __tablename__ = "login_links"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    member_id: Mapped[str] = mapped_column(ForeignKey("members.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)


class WebSession(Base):
    """A logged-in browser: a member of one tenant, or the operator (member_id NULL) who may view any."""

    __tablename__ = "web_sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    member_id: Mapped[str | None] = mapped_column(ForeignKey("members.id", ondelete="CASCADE"), index=True)
    # Forms carry this token back (double submit); it is per session, never in a cookie the page can't read.
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
