"""`kvgate serve`, `kvgate tenants ...`, `kvgate keys ...`: the gateway's commands.

tenants and keys work directly on the database (migrating it first), so they need
no running server and no admin token.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from gateway.serve import AppFactory, Banner
from gateway.settings import GatewaySettings
from kvgate.db import migrate, open_database, utcnow
from kvgate.errors import KvgateError
from kvgate.tenancy import KEY_SCOPES, SCOPE_INFERENCE


def register(subparsers: Any, *, app_factory: AppFactory, banners: Sequence[Banner] = ()) -> None:
    serve = subparsers.add_parser("serve", help="run the gateway with the embedded engine")
    serve.add_argument("--host", help="default KVGATE_HOST or 127.0.0.1")
    serve.add_argument("--port", type=int, help="default KVGATE_PORT or 8080")
    serve.add_argument("--wait-for-db", type=float, default=0.0, metavar="SECONDS", help="retry the database this long")
    serve.set_defaults(handler=functools.partial(cmd_serve, app_factory=app_factory, banners=banners))

    tenants = subparsers.add_parser("tenants", help="manage tenants").add_subparsers(dest="action", required=True)
    create = tenants.add_parser("create", help="create a tenant")
    create.add_argument("name")
    create.set_defaults(handler=db_command(_tenants_create))
    tenants.add_parser("list", help="list tenants").set_defaults(handler=db_command(_tenants_list))
    for action, suspended in (("suspend", True), ("activate", False)):
        sub = tenants.add_parser(action, help=f"{action} a tenant")
        sub.add_argument("tenant_id")
        sub.set_defaults(handler=db_command(_tenants_set_status(suspended)))

    keys = subparsers.add_parser("keys", help="manage API keys").add_subparsers(dest="action", required=True)
    create = keys.add_parser("create", help="issue an API key for a tenant (shown once)")
    create.add_argument("tenant_id")
    create.add_argument("--name", default="default")
    create.add_argument("--expires-in-days", type=float, help="expire the key after this many days")
    create.add_argument("--requests-per-minute", type=int)
    create.add_argument("--input-tokens-per-minute", type=int)
    create.add_argument(
        "--scope",
        action="append",
        dest="scopes",
        metavar="SCOPE",
        help=f"what the key may do, repeatable: {', '.join(KEY_SCOPES)} (default {SCOPE_INFERENCE})",
    )
    create.set_defaults(handler=db_command(_keys_create))
    scopes = keys.add_parser("scopes", help="set an API key's scopes (replacing its old ones)")
    scopes.add_argument("key_id")
    scopes.add_argument("--scope", action="append", dest="scopes", metavar="SCOPE", required=True, help="repeatable")
    scopes.set_defaults(handler=db_command(_keys_scopes))
    revoke = keys.add_parser("revoke", help="revoke an API key")
    revoke.add_argument("key_id")
    revoke.set_defaults(handler=db_command(_keys_revoke))
    listing = keys.add_parser("list", help="list a tenant's API keys")
    listing.add_argument("tenant_id")
    listing.set_defaults(handler=db_command(_keys_list))


def db_command(action: Callable[[Any, argparse.Namespace], Awaitable[None]]) -> Callable[[argparse.Namespace], int]:
    """A handler running `action(session, args)` on the migrated database; a KvgateError: one line, exit 1."""

    def handler(args: argparse.Namespace) -> int:
        url = GatewaySettings().database_url
        migrate(url)

        async def run() -> None:
            async with open_database(url) as sessions, sessions() as session:
                await action(session, args)

        try:
            asyncio.run(run())
        except KvgateError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 1
        return 0

    return handler


async def _tenants_create(session: Any, args: argparse.Namespace) -> None:
    from gateway.services.tenants import create_tenant

    tenant = await create_tenant(session, name=args.name)
    print(f"created tenant {tenant.id} ({tenant.name})")
    print(f"next: kvgate keys create {tenant.id}")


async def _tenants_list(session: Any, args: argparse.Namespace) -> None:
    from gateway.services.tenants import list_tenants

    for tenant in await list_tenants(session):
        print(f"{tenant.id}\t{tenant.status}\t{tenant.name}")


def _tenants_set_status(suspended: bool) -> Callable[[Any, argparse.Namespace], Awaitable[None]]:
    async def action(session: Any, args: argparse.Namespace) -> None:
        from gateway.services.tenants import set_tenant_status

        tenant = await set_tenant_status(session, tenant_id=args.tenant_id, suspended=suspended)
        print(f"tenant {tenant.id} is {tenant.status}")

    return action


async def _keys_create(session: Any, args: argparse.Namespace) -> None:
    from gateway.services.keys import create_key

    expires_at = utcnow() + timedelta(days=args.expires_in_days) if args.expires_in_days else None
    key, plaintext = await create_key(
        session,
        tenant_id=args.tenant_id,
        name=args.name,
        expires_at=expires_at,
        requests_per_minute=args.requests_per_minute,
        input_tokens_per_minute=args.input_tokens_per_minute,
        scopes=args.scopes or [SCOPE_INFERENCE],
    )
    print(f"created key {key.id} for tenant {key.tenant_id} (scopes: {key.scopes}). The key is shown only this once:")
    print(plaintext)


async def _keys_revoke(session: Any, args: argparse.Namespace) -> None:
    from gateway.services.keys import revoke_key

    key = await revoke_key(session, key_id=args.key_id)
    print(f"revoked key {key.id} ({key.prefix}...)")


async def _keys_scopes(session: Any, args: argparse.Namespace) -> None:
    from gateway.services.keys import set_scopes

    key = await set_scopes(session, key_id=args.key_id, scopes=args.scopes)
    # Another process's auth cache keeps the old scopes for up to KVGATE_AUTH_CACHE_TTL_S.
    print(f"key {key.id} ({key.prefix}...) now has scopes: {key.scopes}")


async def _keys_list(session: Any, args: argparse.Namespace) -> None:
    from gateway.services.keys import list_keys

    for key in await list_keys(session, tenant_id=args.tenant_id):
        state = "revoked" if key.revoked_at else "active"
        last_used = key.last_used_at.isoformat() if key.last_used_at else "never"
        print(f"{key.id}\t{key.prefix}...\t{state}\t{key.name}\tlast used {last_used}\tscopes {key.scopes}")


def cmd_serve(args: argparse.Namespace, *, app_factory: AppFactory, banners: Sequence[Banner] = ()) -> int:
    from gateway.serve import run_serve

    return run_serve(
        host=args.host,
        port=args.port,
        wait_for_db_s=getattr(args, "wait_for_db", None) or 0.0,
        app_factory=app_factory,
        banners=banners,
    )
