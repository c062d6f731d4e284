"""The in-flight journal around one request: opened before the engine starts on it, closed once it is recorded."""

from __future__ import annotations

import contextlib
from datetime import datetime

from gateway.billing_hooks import Admission
from gateway.inflight import InflightEntry, JournalError
from gateway.state import Gateway
from kvgate.errors import OverloadedError

OVERLOADED_RETRY_S = 1.0


async def journal_begin(gw: Gateway, *, started_at: datetime, admission: Admission) -> None:
    """Make the admitted request durable in the in-flight journal before the engine starts on it.

    A journal that cannot write (disk full, I/O error) refuses the request with 529/503: a
    request that a crash could lose from billing is not run.
    """
    if gw.journal is None:
        return
    entry = InflightEntry(
        request_id=admission.request_id,
        tenant_id=admission.tenant_id,
        api_key_id=admission.api_key_id,
        model=admission.model,
        endpoint=admission.endpoint,
        started_at=started_at,
        prompt_tokens=admission.prompt_tokens,
    )
    try:
        await gw.journal.begin(entry)
    except BaseException as exc:
        # Cancelled while the write was on its way, it may still land: close it again.
        journal_end(gw, admission.request_id)
        if isinstance(exc, JournalError):  # the journal logs the failure once, not per request
            raise OverloadedError(
                "the server cannot record requests durably right now", retry_after_s=OVERLOADED_RETRY_S
            ) from exc
        raise


def journal_end(gw: Gateway, request_id: str) -> None:
    """The request is recorded (or never ran): its journal entry is closed."""
    if gw.journal is not None:
        with contextlib.suppress(JournalError):
            gw.journal.end(request_id)
