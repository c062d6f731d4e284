"""The usage API (/v1/organization/usage/completions, /v1/organization/costs, /v1/key) and key scopes,
in the real gateway with billing's real hooks, read with the official openai SDK; the numbers must
equal the ledger's exactly, and a tenant sees only its own."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import openai
import pytest
from sqlalchemy import select

from billing.ledger import UsageCharge
from billing.models import LedgerEntry
from billing.money import pico_to_usd
from billing.settlement import settle_charge
from kvgate.usage import EntryKind, TokenCounts
from tests.gateway.harness import GatewayServer, Key

pytestmark = pytest.mark.timeout(300)

SYSTEM = "You are a careful assistant who answers briefly. " * 30
USAGE_READ = ["usage:read"]


@pytest.fixture(scope="module")
def server(db_url, tiny_llama_dir, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVGATE_SPOOL_PATH", str(tmp_path_factory.mktemp("spool") / "spool.jsonl"))
        mp.setenv("KVGATE_AUTO_FINALIZE_INVOICES", "false")
        gw = GatewayServer(
            model_dir=tiny_llama_dir, database_url=db_url, discover_billing=True, default_requests_per_minute=600
        ).start()
    try:
        yield gw
    finally:
        gw.stop()


def usage_client(server: GatewayServer, key: Key) -> openai.OpenAI:
    """The SDK's admin usage methods send admin_api_key as the bearer token: here a tenant key with usage:read."""
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", admin_api_key=key.key, max_retries=0, timeout=60
    )


def raw_get(server: GatewayServer, key: Key, path: str, **params) -> httpx.Response:
    """The SDK's raw client (no typed method for /v1/key); an error status is returned, not raised."""
    client = server.openai(key)
    try:
        return client.get(path, cast_to=httpx.Response, options={"params": params})
    except openai.APIStatusError as error:
        return error.response


async def ledger(sessions, tenant: str) -> list[LedgerEntry]:
    async with sessions() as session:
        return list((await session.scalars(select(LedgerEntry).where(LedgerEntry.tenant_id == tenant))).all())


async def wait_for_entries(sessions, tenant: str, n: int) -> list[LedgerEntry]:
    deadline = time.monotonic() + 60
    while len(entries := await ledger(sessions, tenant)) < n:
        assert time.monotonic() < deadline, "the ledger did not receive every request"
        await asyncio.sleep(0.1)
    return entries


def chat(server: GatewayServer, key: Key, text: str) -> None:
    server.openai(key).chat.completions.create(
        model=server.model,
        max_tokens=4,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
    )


def message(server: GatewayServer, key: Key, text: str) -> None:
    server.anthropic(key).messages.create(
        model=server.model,
        max_tokens=4,
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": text}],
    )


@pytest.fixture(scope="module")
def tenant_a(server, sessions, pricebook):
    """A tenant with two inference keys used live, past usage on another model (days ago), and a usage key."""
    first = server.new_key()
    second = server.new_key(first.tenant_id)
    reader = server.new_key(first.tenant_id, scopes=USAGE_READ)
    for i in range(2):
        chat(server, first, f"question {i}")
    message(server, second, "hello")
    return first, second, reader


async def seed_history(sessions, pricebook, key: Key, days_ago: int) -> None:
    now = datetime.now(UTC)
    async with sessions() as session:
        for i in range(3):
            started = now - timedelta(days=days_ago, minutes=7 * i)
            charge = UsageCharge(
                request_id=f"hist-{key.key_id}-{days_ago}-{i}",
                tenant_id=key.tenant_id,
                api_key_id=key.key_id,
                model="m-test",
                endpoint="messages",
                status="ok",
                started_at=started,
                counts=TokenCounts(input=100 + i, cache_write_1h=2000, cache_write_24h=10, cache_read=5000, output=50),
            )
            version = pricebook.price_for("m-test", started)
            await settle_charge(session=session, charge=charge, version=version, source="live", now=started)
        await session.commit()


def day_of(moment: datetime) -> int:
    return int(moment.replace(hour=0, minute=0, second=0, microsecond=0).timestamp())


async def test_completions_and_costs_equal_the_ledger(server, sessions, pricebook, tenant_a):
    first, second, reader = tenant_a
    await seed_history(sessions, pricebook, first, days_ago=3)
    entries = await wait_for_entries(sessions, first.tenant_id, 3 + 3)
    start = int((datetime.now(UTC) - timedelta(days=5)).timestamp())
    client = usage_client(server, reader)

    page = client.admin.organization.usage.completions(
        start_time=start, bucket_width="1d", group_by=["model", "api_key_id"], limit=31
    )
    raw = client.admin.organization.usage.with_raw_response.completions(
        start_time=start, bucket_width="1d", group_by=["model", "api_key_id"], limit=31
    ).http_response.json()
    assert page.object == "page" and page.has_more is False and len(page.data) == 6  # 5 days ago to today

    # Per day, model and key: the API's numbers equal the ledger's sums exactly.
    expected: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in entries:
        row = expected[(day_of(e.started_at), e.model, e.api_key_id)]
        counts = TokenCounts.from_columns(e)
        row["input_tokens"] += counts.prompt_tokens
        row["input_cached_tokens"] += counts.cache_read
        row["output_tokens"] += counts.output
        row["cache_write_5m_tokens"] += counts.cache_write_5m
        row["cache_write_1h_tokens"] += counts.cache_write_1h
        row["cache_write_24h_tokens"] += counts.cache_write_24h
        row["num_model_requests"] += e.kind == EntryKind.USAGE
        row["cost_pico"] += e.cost_pico
    got: dict[tuple, dict[str, int]] = {}
    for bucket in raw["data"]:
        assert bucket["object"] == "bucket" and bucket["end_time"] - bucket["start_time"] == 86400
        for r in bucket["results"]:
            assert r["object"] == "organization.usage.completions.result"
            assert r["project_id"] is None and r["input_audio_tokens"] == 0
            fields = {name: r[name] for name in expected[next(iter(expected))] if name != "cost_pico"}
            fields["cost_pico"] = int(Decimal(r["cost_usd"]).scaleb(12))
            got[(bucket["start_time"], r["model"], r["api_key_id"])] = fields
    assert got == {key: dict(row) for key, row in expected.items()}
    assert {key[1] for key in got} == {"m-test", server.model}
    assert {key[2] for key in got} == {first.key_id, second.key_id}
    # The typed SDK model reads the same numbers, kvgate's own fields among its extras.
    typed = [r for b in page.data for r in b.results]
    assert sum(r.num_model_requests for r in typed) == 6
    assert sum(r.input_cached_tokens or 0 for r in typed) == sum(e.cache_read_tokens for e in entries)
    assert sum(Decimal(r.model_extra["cost_usd"]) for r in typed) == pico_to_usd(sum(e.cost_pico for e in entries))

    costs = client.admin.organization.usage.with_raw_response.costs(
        start_time=start, group_by=["api_key_id"], limit=10
    ).http_response.json()
    by_key: dict[str, Decimal] = defaultdict(Decimal)
    for bucket in costs["data"]:
        for r in bucket["results"]:
            assert r["object"] == "organization.costs.result" and r["amount"]["currency"] == "usd"
            assert r["amount"]["value"] == pytest.approx(float(r["cost_usd"]))
            by_key[r["api_key_id"]] += Decimal(r["cost_usd"])
    for key in (first, second):
        assert by_key[key.key_id] == pico_to_usd(sum(e.cost_pico for e in entries if e.api_key_id == key.key_id))

    # Minute buckets over the last hour hold the live requests (read from the ledger itself).
    recent = [e for e in entries if e.started_at > datetime.now(UTC) - timedelta(minutes=50)]
    minutes = raw_get(
        server,
        reader,
        "/organization/usage/completions",
        start_time=int(time.time()) - 3000,
        bucket_width="1m",
        limit=60,
    ).json()
    assert len(minutes["data"]) >= 50
    assert sum(r["num_model_requests"] for b in minutes["data"] for r in b["results"]) == len(recent) == 3


async def test_pages_follow_next_page(server, sessions, pricebook, tenant_a):
    first, _, reader = tenant_a
    await seed_history(sessions, pricebook, first, days_ago=4)
    start = int((datetime.now(UTC) - timedelta(days=6)).timestamp())
    client = usage_client(server, reader)
    whole = client.admin.organization.usage.completions(start_time=start, bucket_width="1d", limit=31)
    pages, cursor = [], None
    while True:
        page = client.admin.organization.usage.completions(
            start_time=start, bucket_width="1d", limit=2, **({"page": cursor} if cursor else {})
        )
        pages.append(page)
        if not page.has_more:
            break
        cursor = page.next_page
        assert cursor
    assert len(pages) == 4  # 7 buckets, 2 a page
    assert [b.model_dump() for p in pages for b in p.data] == [b.model_dump() for b in whole.data]


def test_a_tenant_never_sees_another_tenants_usage(server, tenant_a):
    first, second, reader_a = tenant_a
    reader_b = server.new_key(scopes=USAGE_READ)
    start = int(time.time()) - 5 * 3600  # the default limit (24 hours) reaches now
    mine = raw_get(server, reader_a, "/organization/usage/completions", start_time=start, bucket_width="1h")
    theirs = raw_get(
        server,
        reader_b,
        "/organization/usage/completions",
        start_time=start,
        bucket_width="1h",
        **{"api_key_ids[]": [first.key_id, second.key_id]},
    )
    assert mine.status_code == theirs.status_code == 200
    assert sum(r["num_model_requests"] for b in mine.json()["data"] for r in b["results"]) >= 3
    assert all(b["results"] == [] for b in theirs.json()["data"])
    costs_b = raw_get(server, reader_b, "/organization/costs", start_time=start)
    assert costs_b.status_code == 200 and all(b["results"] == [] for b in costs_b.json()["data"])


def test_scopes_gate_usage_and_inference(server, tenant_a):
    first, _, reader = tenant_a
    start = int(time.time()) - 3600
    # An inference key cannot read usage; a usage:read key can.
    denied = raw_get(server, first, "/organization/usage/completions", start_time=start)
    allowed = raw_get(server, reader, "/organization/usage/completions", start_time=start)
    assert (denied.status_code, allowed.status_code) == (403, 200)
    assert denied.json()["error"]["type"] == "permission_error" and "usage:read" in denied.json()["error"]["message"]
    assert raw_get(server, first, "/key").status_code == 403
    assert raw_get(server, reader, "/key").status_code == 200
    # A usage:read key cannot run inference, in each API's own error shape; the inference key can.
    with pytest.raises(openai.PermissionDeniedError) as refused:
        chat(server, reader, "hi")
    assert "inference" in str(refused.value)
    chat(server, first, "hi")
    messages = httpx.post(
        f"{server.base_url}/v1/messages",
        headers={"x-api-key": reader.key, "anthropic-version": "2023-06-01"},
        json={"model": server.model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert messages.status_code == 403 and messages.json()["error"]["type"] == "permission_error"
    assert "inference" in messages.json()["error"]["message"]
    message(server, first, "hi")
    count = httpx.post(
        f"{server.base_url}/v1/messages/count_tokens",
        headers={"x-api-key": reader.key, "anthropic-version": "2023-06-01"},
        json={"model": server.model, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert count.status_code == 403
    with pytest.raises(openai.PermissionDeniedError):
        server.openai(reader).models.list()
    assert server.openai(first).models.list().data


def test_scopes_on_keys_and_adding_one(server):
    tenant = server.new_tenant()
    made = server.admin.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "both"})
    assert made.status_code == 201 and made.json()["scopes"] == ["inference"]  # the default: the old power
    key = Key(tenant_id=tenant, key_id=made.json()["id"], key=made.json()["key"])
    start = int(time.time()) - 60
    assert raw_get(server, key, "/organization/usage/completions", start_time=start).status_code == 403
    # Adding usage:read takes effect at once (the auth cache is evicted).
    patched = server.admin.patch(f"/admin/v1/keys/{key.key_id}", json={"scopes": ["inference", "usage:read"]})
    assert patched.status_code == 200 and patched.json()["scopes"] == ["inference", "usage:read"]
    assert raw_get(server, key, "/organization/usage/completions", start_time=start).status_code == 200
    listed = server.admin.get(f"/admin/v1/tenants/{tenant}/keys").json()["data"]
    assert [k["scopes"] for k in listed] == [["inference", "usage:read"]]
    # Unknown scopes and empty lists are refused, on creation and on change.
    for bad in (["admin"], []):
        created = server.admin.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "x", "scopes": bad})
        changed = server.admin.patch(f"/admin/v1/keys/{key.key_id}", json={"scopes": bad})
        assert created.status_code == changed.status_code == 400, (created.text, changed.text)
    assert server.admin.patch("/admin/v1/keys/key_missing", json={"scopes": ["inference"]}).status_code == 404
    # Taking the scope away again is immediate too.
    server.admin.patch(f"/admin/v1/keys/{key.key_id}", json={"scopes": ["inference"]}).raise_for_status()
    assert raw_get(server, key, "/organization/usage/completions", start_time=start).status_code == 403


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"start_time": None}, "start_time"),
        ({"start_time": "yesterday"}, "start_time"),
        ({"start_time": -5}, "start_time"),
        ({"bucket_width": "1w"}, "bucket_width"),
        ({"bucket_width": "1d", "limit": 32}, "limit"),
        ({"bucket_width": "1m", "limit": 0}, "limit"),
        ({"group_by[]": "project_id"}, "group_by"),
        ({"page": "not-a-cursor"}, "page"),
        ({"page": "17"}, "page"),
        ({"end_time": 1}, "end_time"),
        # Far future (year 9999 overflowed the bucket arithmetic: a 500), far past, absurdly large.
        ({"start_time": 253_402_300_000}, "start_time"),
        ({"start_time": 253_402_300_799, "end_time": 253_402_300_799}, "start_time"),
        ({"end_time": 253_402_300_799}, "end_time"),
        ({"start_time": -62_135_596_800}, "start_time"),
        ({"start_time": 10**40}, "start_time"),
        ({"end_time": -(10**40)}, "end_time"),
    ],
)
def test_bad_parameters_are_400s_in_openais_shape(server, tenant_a, params, param):
    _, _, reader = tenant_a
    query = {
        name: value for name, value in {"start_time": int(time.time()) - 86400, **params}.items() if value is not None
    }
    # The times are parsed alike for costs (its widths and limits differ, so only those are shared).
    paths = ["/organization/usage/completions", *(["/organization/costs"] if param.endswith("_time") else [])]
    for path in paths:
        bad = raw_get(server, reader, path, **query)
        assert bad.status_code == 400, (path, bad.text)
        assert bad.json()["error"]["type"] == "invalid_request_error" and bad.json()["error"]["param"] == param
    good = raw_get(server, reader, "/organization/usage/completions", start_time=int(time.time()) - 86400)
    assert good.status_code == 200


def test_the_latest_accepted_times_answer(server, tenant_a):
    """The last second accepted (end of year 9998) still answers 200 on both APIs, every width."""
    _, _, reader = tenant_a
    latest = 253_370_764_799
    for path, widths in (
        ("/organization/usage/completions", ("1m", "1h", "1d")),
        ("/organization/costs", ("1h", "1d")),
    ):
        for width in widths:
            r = raw_get(server, reader, path, start_time=latest - 60, end_time=latest, bucket_width=width)
            assert r.status_code == 200, (path, width, r.text)


def test_costs_take_days_and_hours_only(server, tenant_a):
    _, _, reader = tenant_a
    start = int(time.time()) - 86400
    assert raw_get(server, reader, "/organization/costs", start_time=start, bucket_width="1m").status_code == 400
    assert raw_get(server, reader, "/organization/costs", start_time=start, bucket_width="1h").status_code == 200
    assert raw_get(server, reader, "/organization/costs", start_time=start, limit=180).status_code == 200


async def test_key_info_reports_spend_limit_and_rate_limits(server, sessions, tenant_a):
    first, _, _ = tenant_a
    first_reader = server.new_key(first.tenant_id, scopes=["inference", "usage:read"])
    chat(server, first_reader, "spend something")
    entries = await wait_for_entries(sessions, first.tenant_id, 1)
    deadline = time.monotonic() + 30
    while not any(e.api_key_id == first_reader.key_id for e in entries):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
        entries = await ledger(sessions, first.tenant_id)
    server.admin.put(f"/admin/v1/keys/{first_reader.key_id}/budget", json={"monthly_limit_usd": "5"}).raise_for_status()
    info = raw_get(server, first_reader, "/key")
    assert info.status_code == 200
    data = info.json()["data"]
    spent = sum(e.cost_pico for e in entries if e.api_key_id == first_reader.key_id)
    assert spent > 0
    for name in ("usage", "usage_daily", "usage_weekly", "usage_monthly"):
        assert Decimal(data["usd"][name]) == pico_to_usd(spent), name
        assert data[name] == pytest.approx(float(pico_to_usd(spent)))
    assert data["id"] == first_reader.key_id and data["label"].endswith("...")
    assert data["limit"] == 5 and data["limit_scope"] == "key_month" and data["limit_reset"] == "monthly"
    assert Decimal(data["usd"]["limit_remaining"]) == Decimal(5) - pico_to_usd(spent)
    assert data["rate_limit"] == {"requests": 600, "input_tokens": None, "interval": "1m"}  # the server default
    assert data["scopes"] == ["inference", "usage:read"]
    # Another key of the same tenant reports its own spend, not this one's.
    other = server.new_key(first.tenant_id, scopes=USAGE_READ, requests_per_minute=7)
    theirs = raw_get(server, other, "/key").json()["data"]
    assert theirs["usage"] == 0 and theirs["limit"] is None and theirs["rate_limit"]["requests"] == 7
