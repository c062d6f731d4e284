"""Dashboard logins over plain HTTP, on SQLite and PostgreSQL: links, cookies, CSRF, expiry, removal, the CLI.

Every refusal is paired with the same request succeeding when it should.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import sqlalchemy as sa

from kvgate import REPO_ROOT
from kvgate.db import utcnow
from tests.gateway.harness import free_port
from tests.web.conftest import Dashboard, csrf_token
from web.settings import WebSettings

pytestmark = pytest.mark.timeout(300)


def _set_cookie(response, name: str) -> str:
    return next(v for v in response.headers.get_list("set-cookie") if v.startswith(f"{name}="))


def test_a_login_link_sets_a_strict_session_cookie_and_lands_on_the_overview(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member("Cookie Co")
    with any_dashboard.client() as anonymous:
        assert anonymous.get("/").headers["location"] == "/login"
    with any_dashboard.client() as client:
        response = client.get(member.login_url.removeprefix(any_dashboard.base_url))
        assert response.status_code == 303 and response.headers["location"] == "/"
        cookie = _set_cookie(response, "kvgate_session").lower()
        assert "httponly" in cookie and "samesite=lax" in cookie and "path=/" in cookie
        assert "secure" not in cookie  # plain HTTP here
        overview = client.get("/")
        assert overview.status_code == 200 and "Cookie Co" in overview.text
        assert "default-src 'none'" in overview.headers["content-security-policy"]


def test_the_cookie_is_secure_over_https(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member()
    with any_dashboard.client() as client:
        # uvicorn trusts X-Forwarded-Proto from 127.0.0.1, as from a TLS-terminating proxy there.
        path = member.login_url.removeprefix(any_dashboard.base_url)
        response = client.get(path, headers={"x-forwarded-proto": "https"})
        assert response.status_code == 303
        assert "secure" in _set_cookie(response, "kvgate_session").lower()


def test_links_and_cookies_follow_an_https_public_url(dashboard: Dashboard) -> None:
    with dashboard.web_settings(WebSettings(public_url="https://dash.example.com/")):
        member = dashboard.new_member()
        assert member.login_url.startswith("https://dash.example.com/login/")
        with dashboard.client() as client:  # the proxy in front would forward this path to us
            response = client.get(member.login_url.removeprefix("https://dash.example.com"))
            assert response.status_code == 303
            assert "secure" in _set_cookie(response, "kvgate_session").lower()


def test_a_link_works_once_and_not_after_expiry(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member()
    path = member.login_url.removeprefix(any_dashboard.base_url)
    with any_dashboard.client() as client:
        assert client.get(path).status_code == 303
        again = client.get(path)
        assert again.status_code == 400 and "already been used" in again.text
        unknown = client.get("/login/not-a-real-token")
        assert unknown.status_code == 400 and "not valid" in unknown.text
    late = any_dashboard.new_link(member)
    with any_dashboard.server.db.begin() as conn:
        conn.execute(sa.text("UPDATE login_links SET expires_at = :t WHERE used_at IS NULL"), {"t": utcnow()})
    with any_dashboard.client() as client:
        expired = client.get(late.removeprefix(any_dashboard.base_url))
        assert expired.status_code == 400 and "expired" in expired.text
        assert "kvgate_session" not in expired.headers.get("set-cookie", "")
    fresh = any_dashboard.new_link(member)  # a new link works again
    any_dashboard.client_for(fresh).close()


def test_logout_needs_the_csrf_token(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member()
    with any_dashboard.client_for(member.login_url) as client:
        token = csrf_token(client.get("/").text)
        assert client.post("/logout").status_code == 403
        assert client.post("/logout", data={"csrf_token": "forged"}).status_code == 403
        assert client.post("/logout", headers={"x-csrf-token": "forged"}).status_code == 403
        assert client.get("/").status_code == 200  # still logged in
        response = client.post("/logout", data={"csrf_token": token})
        assert response.status_code == 303 and response.headers["location"] == "/login"
        assert client.get("/").headers["location"] == "/login"


def test_the_csrf_token_may_come_as_a_header(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member()
    with any_dashboard.client_for(member.login_url) as client:
        token = csrf_token(client.get("/").text)
        assert client.post("/logout", headers={"x-csrf-token": token}).status_code == 303


def test_another_sessions_csrf_token_is_refused(any_dashboard: Dashboard) -> None:
    one, two = any_dashboard.new_member(), any_dashboard.new_member()
    with any_dashboard.client_for(one.login_url) as first, any_dashboard.client_for(two.login_url) as second:
        theirs = csrf_token(second.get("/").text)
        assert first.post("/logout", data={"csrf_token": theirs}).status_code == 403
        assert second.post("/logout", data={"csrf_token": theirs}).status_code == 303


def test_the_operator_form_is_protected_and_checks_the_token(any_dashboard: Dashboard) -> None:
    from tests.gateway.harness import ADMIN_TOKEN

    with any_dashboard.client() as client:
        token = csrf_token(client.get("/login").text)
        # The login form's double submit: the field must equal the pre-session cookie.
        no_field = client.post("/login", data={"admin_token": ADMIN_TOKEN})
        assert no_field.status_code == 403 and "kvgate_session" not in no_field.headers.get("set-cookie", "")
        assert client.post("/login", data={"admin_token": ADMIN_TOKEN, "csrf_token": "x" * 43}).status_code == 403
        wrong = client.post("/login", data={"admin_token": "guess", "csrf_token": token})
        assert wrong.status_code == 401 and "kvgate_session" not in wrong.headers.get("set-cookie", "")
        right = client.post("/login", data={"admin_token": ADMIN_TOKEN, "csrf_token": token})
        assert right.status_code == 303 and right.headers["location"] == "/admin"
        assert client.get("/admin").status_code == 200
    with any_dashboard.client() as cross_site:  # a forged form has no cookie to match
        response = cross_site.post("/login", data={"admin_token": ADMIN_TOKEN, "csrf_token": token})
        assert response.status_code == 403


def test_sessions_expire(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member()
    with any_dashboard.client_for(member.login_url) as client:
        assert client.get("/").status_code == 200
        with any_dashboard.server.db.begin() as conn:
            conn.execute(
                sa.text("UPDATE web_sessions SET expires_at = :t WHERE member_id = :m"),
                {"t": utcnow() - timedelta(seconds=1), "m": member.member_id},
            )
        assert client.get("/").headers["location"] == "/login"


def test_removing_a_member_ends_their_session_and_their_links(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member()
    with any_dashboard.client_for(member.login_url) as client:
        assert client.get("/").status_code == 200
        spare = any_dashboard.new_link(member)  # issued after the first was spent (a new one retires older ones)
        admin = any_dashboard.admin
        other_tenant = any_dashboard.new_tenant()
        # Another tenant's URL with this member's id: not found, and the member is untouched.
        wrong = admin.post(f"/admin/v1/tenants/{other_tenant}/members/{member.member_id}/remove")
        assert wrong.status_code == 404
        assert client.get("/").status_code == 200
        removed = admin.post(f"/admin/v1/tenants/{member.tenant_id}/members/{member.member_id}/remove")
        assert removed.status_code == 200
        assert client.get("/").headers["location"] == "/login"
    with any_dashboard.client() as client:
        assert client.get(spare.removeprefix(any_dashboard.base_url)).status_code == 400
    listed = any_dashboard.admin.get(f"/admin/v1/tenants/{member.tenant_id}/members").json()["data"]
    assert listed == []


def test_the_admin_api_invites_members(any_dashboard: Dashboard) -> None:
    tenant = any_dashboard.new_tenant()
    admin = any_dashboard.admin
    url = f"/admin/v1/tenants/{tenant}/members"
    created = admin.post(url, json={"email": "  Ada@Example.COM ", "role": "billing"})
    assert created.status_code == 201
    body = created.json()
    assert body["email"] == "ada@example.com" and body["role"] == "billing" and body["emailed"] is False
    assert body["login_url"].startswith(f"{any_dashboard.base_url}/login/")
    # Inviting the same address again keeps one member (with the new role) and issues a new link.
    again = admin.post(url, json={"email": "ada@example.com", "role": "viewer"}).json()
    assert again["id"] == body["id"] and again["login_url"] != body["login_url"]
    assert [m["role"] for m in admin.get(url).json()["data"]] == ["viewer"]
    bad_bodies = (
        {"email": "not an address"},
        {"email": "a\u0000b@example.com"},  # PostgreSQL text cannot hold NUL: refused before it gets there
        {"email": "a@b.c", "role": "owner"},
        {"email": "a@b.c", "x": 1},
    )
    for bad in bad_bodies:
        response = admin.post(url, json=bad)
        assert response.status_code == 400, bad
    assert admin.post("/admin/v1/tenants/ten_nope/members", json={"email": "a@b.co"}).status_code == 404
    assert any_dashboard.client().post(url, json={"email": "a@b.co"}).status_code == 401  # no admin token


def test_kvgate_members_invite_prints_a_working_link(any_dashboard: Dashboard) -> None:
    tenant = any_dashboard.new_tenant("CLI Tenant")
    settings = any_dashboard.server.settings
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "KVGATE_DATABASE_URL": settings.database_url,
        "KVGATE_PORT": str(settings.port),
    }
    env.pop("KVGATE_PUBLIC_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "members", "invite", tenant, "Grace@Example.com", "--role", "admin"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    link = result.stdout.strip()
    assert link.startswith(f"http://127.0.0.1:{settings.port}/login/") and "\n" not in link
    assert "warning" not in result.stderr  # the server answers where the link points
    # A shell that does not know the server's port: the link points elsewhere, and the CLI says so.
    elsewhere = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "members", "invite", tenant, "lost@example.com"],
        env={**env, "KVGATE_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert elsewhere.returncode == 0 and "no kvgate answers at" in elsewhere.stderr, elsewhere.stderr
    assert "KVGATE_PUBLIC_URL" in elsewhere.stderr
    client = any_dashboard.client_for(link)
    assert "CLI Tenant" in client.get("/").text
    listed = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "members", "list", tenant],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "grace@example.com" in listed.stdout and "admin" in listed.stdout
    # --output json is the admin API's own answer for the same members; csv has the same header.
    api_members = any_dashboard.admin.get(f"/admin/v1/tenants/{tenant}/members").json()["data"]
    as_json = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "members", "list", tenant, "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(as_json.stdout) == api_members and api_members[0]["email"] == "grace@example.com"
    as_csv = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "members", "list", tenant, "-o", "csv"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert as_csv.stdout.splitlines()[0].split(",") == list(api_members[0])
    removed = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "members", "remove", tenant, "GRACE@example.com"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert removed.returncode == 0, removed.stderr
    try:
        assert client.get("/").headers["location"] == "/login"  # the session ended with the membership
    finally:
        client.close()
    bad = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "members", "invite", "ten_missing", "a@b.co"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert bad.returncode == 1 and "not found" in bad.stderr and bad.stdout == ""


def test_a_new_link_retires_the_older_unused_ones_and_no_token_is_logged(any_dashboard: Dashboard, capfd) -> None:
    member = any_dashboard.new_member()
    older = any_dashboard.new_link(member)
    newest = any_dashboard.new_link(member)
    with any_dashboard.client() as client:
        refused = client.get(older.removeprefix(any_dashboard.base_url))
        assert refused.status_code == 400 and "kvgate_session" not in refused.headers.get("set-cookie", "")
        assert client.get(newest.removeprefix(any_dashboard.base_url)).status_code == 303  # the newest works
    token = newest.rsplit("/", 1)[1]
    logged = capfd.readouterr()
    assert "/login/***" in logged.out + logged.err  # the request line is there, without its token
    assert token not in logged.out + logged.err
    from gateway.api.middleware import logged_path

    assert logged_path(f"/login/{token}") == "/login/***" and logged_path("/login") == "/login"
