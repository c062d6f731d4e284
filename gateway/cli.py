"""`kvgate serve`, `kvgate tenants ...`, `kvgate keys ...`: the gateway's commands.

tenants and keys work directly on the database (writes migrate it first; lists never create it), so
they need no running server and no admin token. Listings print the admin API's own models
(TenantOut, KeyOut): `--output json` gives the same field names as GET /admin/v1/tenants.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, Any

import typer

from gateway.protocols.admin import KeyOut, TenantOut
from gateway.serve import AppFactory, Banner
from kvgate.cli_database import Sessions, announce_database, run_on_database
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit
from kvgate.db import utcnow
from kvgate.tenancy import KEY_SCOPES, SCOPE_INFERENCE

TENANT_COLUMNS = ("id", "name", "status", "created_at")
KEY_COLUMNS = (
    "id",
    "name",
    Column("prefix", value=lambda key: f"{key.prefix}..."),
    Column("state", value=lambda key: key_state(key)),
    Column("scopes"),
    Column("last_used_at", header="last used", value=lambda key: key.last_used_at or "never"),
    Column("expires_at", header="expires"),
    Column("requests_per_minute", header="req/min"),
    Column("input_tokens_per_minute", header="input tok/min"),
)

ScopesOption = Annotated[
    list[str] | None,
    typer.Option("--scope", metavar="SCOPE", help=f"what the key may do, repeatable: {', '.join(KEY_SCOPES)}"),
]


def register(app: typer.Typer, *, app_factory: AppFactory, banners: Sequence[Banner] = ()) -> None:
    """Add `serve`, `tenants` and `keys` to the `kvgate` command."""

    @app.command("serve")
    def serve(
        host: Annotated[str | None, typer.Option(help="default KVGATE_HOST or 127.0.0.1")] = None,
        port: Annotated[int | None, typer.Option(help="default KVGATE_PORT or 8080")] = None,
        wait_for_db: Annotated[
            float,
            typer.Option("--wait-for-db", metavar="SECONDS", min=0, help="retry an unreachable database this long"),
        ] = 0.0,
    ) -> None:
        """Run the gateway: with the embedded engine, or in front of the engines KVGATE_ENGINES lists."""
        from gateway.serve import run_serve
        from gateway.settings import GatewaySettings

        # Without a terminal stderr is the JSON log stream, where the database_migrated event names it.
        if sys.stderr.isatty():
            # Invalid settings: run_serve reports them in its own one line, as a start-up failure.
            with contextlib.suppress(ValueError):
                announce_database(GatewaySettings().database_url)
        code = run_serve(host=host, port=port, wait_for_db_s=wait_for_db, app_factory=app_factory, banners=banners)
        if code:
            raise typer.Exit(code)

    app.add_typer(tenants_app(), name="tenants")
    app.add_typer(keys_app(), name="keys")


def tenants_app() -> typer.Typer:
    tenants = typer.Typer(help="Manage tenants.", no_args_is_help=True)

    @tenants.command("create")
    def create(name: str) -> None:
        """Create a tenant."""
        from gateway.services.tenants import create_tenant

        async def action(sessions: Sessions) -> Any:
            async with sessions() as session:
                return await create_tenant(session, name=name)

        tenant = run_on_database(action, write=True)
        print(f"created tenant {tenant.id} ({tenant.name})")
        print(f"next: kvgate keys create {tenant.id}")

    @tenants.command("list")
    def list_(output: OutputOption = OutputFormat.table) -> None:
        """List tenants (the table also names each tenant's active keys)."""
        from sqlalchemy import select

        from gateway.services.tenants import list_tenants
        from kvgate.tenancy import ApiKey

        async def action(sessions: Sessions) -> tuple[list[TenantOut], dict[str, list[str]]]:
            async with sessions() as session:
                tenants = [TenantOut.model_validate(t) for t in await list_tenants(session)]
                active = select(ApiKey.tenant_id, ApiKey.name).where(ApiKey.revoked_at.is_(None))
                names: dict[str, list[str]] = {}
                for tenant_id, name in (await session.execute(active.order_by(ApiKey.created_at))).all():
                    names.setdefault(tenant_id, []).append(name)
                return tenants, names

        tenants, key_names = run_on_database(action, write=False)
        # JSON and CSV stay the admin API's TenantOut; the key names are the table's own column.
        columns = [*TENANT_COLUMNS, Column("keys", value=lambda tenant: key_names.get(tenant.id, []))]
        emit(tenants, fmt=output, columns=columns, model=TenantOut)

    for verb, suspended in (("suspend", True), ("activate", False)):
        tenants.command(verb, help=f"{verb.capitalize()} a tenant.")(_set_status(suspended))
    return tenants


def _set_status(suspended: bool) -> Any:
    def command(tenant_id: str) -> None:
        from gateway.services.tenants import set_tenant_status

        async def action(sessions: Sessions) -> Any:
            async with sessions() as session:
                return await set_tenant_status(session, tenant_id=tenant_id, suspended=suspended)

        tenant = run_on_database(action, write=True)
        if suspended:
            _tell_gateways(tenant_id=tenant.id)
        print(f"tenant {tenant.id} is {tenant.status}")

    return command


def keys_app() -> typer.Typer:
    keys = typer.Typer(help="Manage API keys.", no_args_is_help=True)

    @keys.command("create")
    def create(
        tenant_id: str,
        name: Annotated[str, typer.Option(help="a name to tell the key by")] = "default",
        expires_in_days: Annotated[float | None, typer.Option(help="expire the key after this many days")] = None,
        requests_per_minute: Annotated[int | None, typer.Option()] = None,
        input_tokens_per_minute: Annotated[int | None, typer.Option()] = None,
        scopes: ScopesOption = None,
    ) -> None:
        """Issue an API key for a tenant (shown once). Default scope: inference."""
        from gateway.services.keys import create_key

        expires_at = utcnow() + timedelta(days=expires_in_days) if expires_in_days else None

        async def action(sessions: Sessions) -> Any:
            async with sessions() as session:
                return await create_key(
                    session,
                    tenant_id=tenant_id,
                    name=name,
                    expires_at=expires_at,
                    requests_per_minute=requests_per_minute,
                    input_tokens_per_minute=input_tokens_per_minute,
                    scopes=scopes or [SCOPE_INFERENCE],
                )

        key, plaintext = run_on_database(action, write=True)
        print(f"created key {key.id} ({key.name}) for tenant {key.tenant_id} (scopes: {key.scopes}).")
        print("The key is shown only this once:")
        print(plaintext)

    @keys.command("scopes")
    def scopes_(key_id: str, scopes: ScopesOption = None) -> None:
        """Set an API key's scopes (replacing its old ones)."""
        from gateway.services.keys import set_scopes

        if not scopes:
            raise ValueError(f"give the key's new scopes with --scope (repeatable): {', '.join(KEY_SCOPES)}")

        async def action(sessions: Sessions) -> Any:
            async with sessions() as session:
                return await set_scopes(session, key_id=key_id, scopes=scopes)

        key = run_on_database(action, write=True)
        # Without KVGATE_REDIS_URL, a gateway's auth cache keeps the old scopes for up to KVGATE_AUTH_CACHE_TTL_S.
        _tell_gateways(key_id=key.id)
        print(f"key {key.id} ({key.name}, {key.prefix}...) now has scopes: {key.scopes}")

    @keys.command("revoke")
    def revoke(key_id: str) -> None:
        """Revoke an API key."""
        from gateway.services.keys import revoke_key

        async def action(sessions: Sessions) -> Any:
            async with sessions() as session:
                return await revoke_key(session, key_id=key_id)

        key = run_on_database(action, write=True)
        _tell_gateways(key_id=key.id)
        print(f"revoked key {key.id} ({key.name}, {key.prefix}...)")

    @keys.command("list")
    def list_(tenant_id: str, output: OutputOption = OutputFormat.table) -> None:
        """List a tenant's API keys."""
        from gateway.services.keys import list_keys

        async def action(sessions: Sessions) -> list[KeyOut]:
            async with sessions() as session:
                return [KeyOut.model_validate(k) for k in await list_keys(session, tenant_id=tenant_id)]

        emit(run_on_database(action, write=False), fmt=output, columns=KEY_COLUMNS, model=KeyOut)

    return keys


def _tell_gateways(*, key_id: str | None = None, tenant_id: str | None = None) -> None:
    """Have running gateways drop the changed key or tenant from their auth caches (KVGATE_REDIS_URL)."""
    import asyncio

    from gateway.auth_invalidation import Eviction, publish_eviction
    from kvgate.settings import KvgateSettings

    url = KvgateSettings().redis_url
    if url and not asyncio.run(publish_eviction(url, Eviction(key_id=key_id, tenant_id=tenant_id))):
        print(
            "note: could not reach Redis to tell running gateways; they see the change within KVGATE_AUTH_CACHE_TTL_S",
            file=sys.stderr,
        )


def key_state(key: KeyOut) -> str:
    if key.revoked_at:
        return "revoked"
    if key.expires_at and key.expires_at <= utcnow():
        return "expired"
    return "active"
