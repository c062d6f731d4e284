"""Logging helpers for the gateway."""

from __future__ import annotations

import traceback
from typing import Any


def log_failure(logger: Any, event: str, **fields: Any) -> None:
    """Log the exception being handled, with its traceback as plain text.

    Pre-formatted on purpose: structlog's default console renderer (used when logging
    is not configured, as under pytest) renders tracebacks with every local's repr,
    which for an engine or a tokenizer takes seconds.
    """
    logger.error(event, traceback=traceback.format_exc(), **fields)
