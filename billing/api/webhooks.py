"""Public: the Stripe webhook, POST /webhooks/stripe, authenticated by its signature (no admin token)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from billing import webhooks
from billing.api.deps import ServiceDep
from billing.errors import NotConfiguredError
from billing.schemas import WebhookOut

router = APIRouter()


@router.post("/webhooks/stripe", include_in_schema=False)
async def stripe_webhook(request: Request, service: ServiceDep) -> Response:
    secret = service.settings.stripe_webhook_secret
    if secret is None:
        raise NotConfiguredError("Stripe webhooks are not configured: set KVGATE_STRIPE_WEBHOOK_SECRET")
    outcome = await webhooks.handle_stripe_webhook(
        sessions=service.sessions,
        payload=await request.body(),
        signature=request.headers.get("stripe-signature", ""),
        secret=secret.get_secret_value(),
    )
    return Response(WebhookOut(received=True, outcome=outcome).model_dump_json(), media_type="application/json")
