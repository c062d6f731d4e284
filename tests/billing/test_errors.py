"""Billing's domain errors carry their HTTP status and API types, so the gateway's one mapping renders them."""

from __future__ import annotations

import json

import pytest

from billing.budgets import TENANT_MONTH, BudgetError, BudgetExceededError, UnknownOwnerError
from billing.catalog import PriceConflictError
from billing.credit_notes import CreditNoteError
from billing.invoices import InvoiceNotFoundError, InvoiceStateError
from billing.ledger import LedgerError, UsageEntryNotFoundError
from billing.money import MoneyError
from billing.pricebook import NoPriceError
from billing.prices import PriceError
from billing.stripe_sync import StripeSyncError
from billing.usage_queries import UsageQueryError
from billing.webhooks import WebhookSignatureError
from gateway.api.errors import render_error
from kvgate.errors import KvgateError

CASES = [
    (MoneyError, 400, "invalid_request_error"),
    (PriceError, 400, "invalid_request_error"),
    (PriceConflictError, 409, "conflict_error"),
    (NoPriceError, 500, "api_error"),  # a catalog without the model is the server's problem
    (LedgerError, 400, "invalid_request_error"),
    (UsageEntryNotFoundError, 404, "not_found_error"),
    (BudgetError, 400, "invalid_request_error"),
    (UnknownOwnerError, 404, "not_found_error"),
    (InvoiceNotFoundError, 404, "not_found_error"),
    (InvoiceStateError, 409, "conflict_error"),
    (CreditNoteError, 400, "invalid_request_error"),
    (UsageQueryError, 400, "invalid_request_error"),
    (WebhookSignatureError, 400, "invalid_request_error"),
]


@pytest.mark.parametrize(("cls", "status", "anthropic_type"), CASES, ids=[c[0].__name__ for c in CASES])
def test_each_billing_error_renders_with_its_status(cls: type[Exception], status: int, anthropic_type: str) -> None:
    error = cls("what went wrong")
    assert isinstance(error, KvgateError)
    response = render_error(error, dialect="anthropic", request_id="req_1")
    assert response.status_code == status
    assert json.loads(response.body)["error"] == {"type": anthropic_type, "message": "what went wrong"}
    assert render_error(error, dialect="openai", request_id="req_1").status_code == status


def test_input_errors_are_still_value_errors() -> None:
    # The CLI and pydantic validators catch ValueError; the move under KvgateError keeps that.
    for cls, status, _ in CASES:
        if status == 400:
            assert issubclass(cls, ValueError), cls


def test_budget_refusal_is_402_and_openai_says_429() -> None:
    error = BudgetExceededError(scope=TENANT_MONTH, limit_pico=10, spent_pico=10, reserved_pico=0, needed_pico=1)
    anthropic = render_error(error, dialect="anthropic", request_id="req_1")
    assert anthropic.status_code == 402
    assert json.loads(anthropic.body)["error"]["type"] == "billing_error"
    openai = render_error(error, dialect="openai", request_id="req_1")
    assert openai.status_code == 429
    assert json.loads(openai.body)["error"]["code"] == "insufficient_quota"


def test_errors_outside_the_model_stay_unmapped() -> None:
    # A Stripe failure is not the client's doing: it is no KvgateError, so it reaches the catch-all 500.
    assert not issubclass(StripeSyncError, KvgateError)
