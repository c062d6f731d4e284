"""The Alerts page over plain HTTP: admins choose kinds and recipients and add webhook endpoints (the secret shown
once; hostile URLs a 400), everyone else reads; CSRF and tenancy as on the other pages."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from alerts import store
from alerts.evaluator import AlertEvaluator
from alerts.rules import Fired
from kvgate.db import open_database, utcnow
from tests.web.conftest import Dashboard, csrf_token
from tests.web.pages_setup import run_async

HOSTILE = ["javascript:alert(1)", "file:///etc/passwd", "gopher://127.0.0.1:6379/_x", "https://u:p@example.com/"]


def test_the_evaluator_runs_in_the_servers_lifespan(dashboard: Dashboard) -> None:
    assert isinstance(dashboard.server.app.state.alert_evaluator, AlertEvaluator)


def test_an_admin_adds_an_endpoint_and_sees_its_secret_once(dashboard: Dashboard) -> None:
    member = dashboard.new_member()
    with dashboard.client_for(member.login_url) as client:
        page = client.get("/alerts")
        assert page.status_code == 200 and 'href="/alerts" aria-current="page"' in page.text
        token = csrf_token(page.text)
        created = client.post(
            "/alerts/endpoints", data={"url": "https://hooks.example.com/kvgate", "csrf_token": token}
        )
        assert created.status_code == 201
        (secret,) = re.findall(r'<code id="new-secret">(whsec_[0-9a-f]+)</code>', created.text)
        again = client.get("/alerts")
        assert "https://hooks.example.com/kvgate" in again.text and secret not in again.text
        (endpoint_id,) = re.findall(r'data-endpoint-id="([^"]+)"', again.text)
        removed = client.post(f"/alerts/endpoints/{endpoint_id}/remove", data={"csrf_token": token})
        assert removed.status_code == 303 and "hooks.example.com" not in client.get("/alerts").text


@pytest.mark.parametrize("url", HOSTILE)
def test_hostile_webhook_urls_are_a_400(dashboard: Dashboard, url: str) -> None:
    member = dashboard.new_member()
    with dashboard.client_for(member.login_url) as client:
        token = csrf_token(client.get("/alerts").text)
        refused = client.post("/alerts/endpoints", data={"url": url, "csrf_token": token})
        assert refused.status_code == 400 and "whsec_" not in refused.text and 'role="alert"' in refused.text
        assert "No webhook endpoints." in client.get("/alerts").text


def test_settings_are_saved_and_bad_recipients_are_a_400(dashboard: Dashboard) -> None:
    member = dashboard.new_member()
    with dashboard.client_for(member.login_url) as client:
        token = csrf_token(client.get("/alerts").text)
        bad = client.post("/alerts", data={"kinds": ["budget_80"], "recipients": "not-an-address", "csrf_token": token})
        assert bad.status_code == 400 and "not an email address" in bad.text
        unknown = client.post("/alerts", data={"kinds": ["launch_missiles"], "csrf_token": token})
        assert unknown.status_code == 400
        saved = client.post(
            "/alerts",
            data={
                "kinds": ["budget_80", "refusals"],
                "recipients": "Ops@Example.com, b@example.com",
                "csrf_token": token,
            },
        )
        assert saved.status_code == 303
        page = client.get("/alerts").text
        assert 'value="budget_80" checked' in page and 'value="refusals" checked' in page
        assert 'value="spend_anomaly" checked' not in page and "ops@example.com, b@example.com" in page


def test_changes_need_an_admin_and_the_csrf_token(dashboard: Dashboard) -> None:
    viewer = dashboard.new_member(role="viewer")
    with dashboard.client_for(viewer.login_url) as client:
        page = client.get("/alerts")
        assert page.status_code == 200 and "Only the tenant's admins" in page.text
        refused = client.post(
            "/alerts/endpoints", data={"url": "https://x.example/", "csrf_token": csrf_token(page.text)}
        )
        assert refused.status_code == 403
    admin = dashboard.new_member()
    with dashboard.client_for(admin.login_url) as client:
        token = csrf_token(client.get("/alerts").text)
        forged = client.post("/alerts/endpoints", data={"url": "https://x.example/", "csrf_token": "forged"})
        assert forged.status_code == 403
        created = client.post("/alerts/endpoints", data={"url": "https://x.example/", "csrf_token": token})
        (endpoint_id,) = re.findall(r'data-endpoint-id="([^"]+)"', created.text)
    other = dashboard.new_member()
    with dashboard.client_for(other.login_url) as client:  # another tenant's endpoint is not found
        token = csrf_token(client.get("/alerts").text)
        assert client.post(f"/alerts/endpoints/{endpoint_id}/remove", data={"csrf_token": token}).status_code == 404


def test_recent_deliveries_show_each_attempt(dashboard: Dashboard) -> None:
    member = dashboard.new_member()

    async def fire_one() -> str:
        async with open_database(dashboard.server.database_url) as sessions, sessions() as session:
            await store.save_settings(session, tenant_id=member.tenant_id, kinds=("refusals",), recipients=())
            await store.add_endpoint(
                session, tenant_id=member.tenant_id, url="http://127.0.0.1:9/hook", allow_private=True
            )
            alerts = await store.tenant_alerts(session, member.tenant_id)
            now = utcnow()
            fired = Fired(kind="refusals", period="test-hour", summary="2 request(s) refused")
            event_id = await store.fire(session, alerts=alerts, fired=fired, now=now)
            assert event_id is not None
            due = await store.due_deliveries(session, now=now, limit=1000)
            (delivery,) = [d for d in due if d.event_id == event_id]
            # Claimed first, as the evaluator does, so the server's own evaluator does not take this attempt too.
            assert await store.claim(session, delivery, now=now, lease=timedelta(minutes=2))
            await store.record_attempt(
                session,
                delivery_id=delivery.id,
                attempt=1,
                started_at=now,
                finished_at=now,
                status_code=503,
                error="the receiver answered 503",
                next_attempt_at=now + timedelta(minutes=2),
            )
            await session.commit()
            return event_id

    with dashboard.client_for(member.login_url) as client:
        assert "No alerts have fired yet." in client.get("/alerts").text
        event_id = run_async(fire_one)
        page = client.get("/alerts").text
    assert f'data-event-id="{event_id}" data-state="pending"' in page
    assert "2 request(s) refused" in page and "HTTP 503" in page and "the receiver answered 503" in page
