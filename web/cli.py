"""`kvgate members invite|list|remove|link`: a tenant's dashboard members, on the database directly.

Like `kvgate keys`, these migrate the database first and need no running server. `invite` and `link`
print the single-use login link on stdout (and mail it when KVGATE_SMTP_URL is set).
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gateway.cli import db_command
from gateway.settings import GatewaySettings
from kvgate.errors import NotFoundError
from kvgate.tenancy import MEMBER_ROLES
from web import members
from web.mail import MAIL_ERRORS, send_login_link
from web.settings import WebSettings, public_url


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("members", help="manage a tenant's dashboard members")
    actions = parser.add_subparsers(dest="action", required=True)
    invite = actions.add_parser("invite", help="invite a member and print their single-use login link")
    invite.add_argument("tenant_id")
    invite.add_argument("email")
    invite.add_argument("--role", choices=MEMBER_ROLES, default="viewer")
    invite.set_defaults(handler=db_command(_invite))
    listing = actions.add_parser("list", help="list a tenant's members")
    listing.add_argument("tenant_id")
    listing.set_defaults(handler=db_command(_list))
    remove = actions.add_parser("remove", help="remove a member (ends their sessions)")
    remove.add_argument("tenant_id")
    remove.add_argument("member", help="the member's id or email")
    remove.set_defaults(handler=db_command(_remove))
    link = actions.add_parser("link", help="print a new login link for a member")
    link.add_argument("tenant_id")
    link.add_argument("member", help="the member's id or email")
    link.set_defaults(handler=db_command(_link))


SERVE_BANNER = """
kvgate: the dashboard is at {url}/
  Invite its first member (prints a login link that works once, within {minutes:g} minutes):
    kvgate members invite <tenant id> you@example.com --role admin
  The operator logs in at {url}/login with the admin token. Links use KVGATE_PUBLIC_URL when set.
"""


def serve_banner(gateway: GatewaySettings) -> str:
    """What `kvgate serve` prints about the dashboard: where it is and how to let the first member in."""
    settings = WebSettings()
    url = public_url(settings, host=gateway.host, port=gateway.port)
    return SERVE_BANNER.format(url=url, minutes=settings.login_link_ttl_minutes)


def _base_url() -> tuple[WebSettings, str]:
    web, gateway = WebSettings(), GatewaySettings()
    return web, public_url(web, host=gateway.host, port=gateway.port)


async def _find(session: AsyncSession, tenant_id: str, member: str) -> Any:
    if "@" not in member:
        return await members.get_member(session, tenant_id=tenant_id, member_id=member)
    address = members.normalize_email(member)
    for found in await members.list_members(session, tenant_id=tenant_id):
        if found.email == address:
            return found
    raise NotFoundError(f"{address} is not a member of tenant {tenant_id}")


async def _print_link(settings: WebSettings, *, email: str, url: str, tenant_name: str) -> None:
    print(url, flush=True)
    try:
        if await send_login_link(settings, to=email, url=url, tenant_name=tenant_name):
            print(f"mailed the link to {email}", file=sys.stderr)
    except MAIL_ERRORS as exc:
        print(f"could not mail the link ({exc}); pass it on yourself", file=sys.stderr)


async def _invite(session: AsyncSession, args: argparse.Namespace) -> None:
    from gateway.services.tenants import get_tenant

    settings, base = _base_url()
    tenant = await get_tenant(session, tenant_id=args.tenant_id)
    ttl = timedelta(minutes=settings.login_link_ttl_minutes)
    invitation = await members.invite_with_link(
        session, tenant_id=tenant.id, email=args.email, role=args.role, base_url=base, ttl=ttl
    )
    member = invitation.member
    print(
        f"{member.email} ({member.role}) can log in to {tenant.name} once, within "
        f"{settings.login_link_ttl_minutes:g} minutes, with:",
        file=sys.stderr,
    )
    await _print_link(settings, email=member.email, url=invitation.login_url, tenant_name=tenant.name)


async def _list(session: AsyncSession, args: argparse.Namespace) -> None:
    for member in await members.list_members(session, tenant_id=args.tenant_id):
        last = member.last_login_at.isoformat() if member.last_login_at else "never"
        print(f"{member.id}\t{member.role}\t{member.email}\tlast login {last}")


async def _remove(session: AsyncSession, args: argparse.Namespace) -> None:
    member = await _find(session, args.tenant_id, args.member)
    await members.remove_member(session, tenant_id=args.tenant_id, member_id=member.id)
    print(f"removed {member.email} from tenant {args.tenant_id}; their sessions have ended")


async def _link(session: AsyncSession, args: argparse.Namespace) -> None:
    from gateway.services.tenants import get_tenant

    settings, base = _base_url()
    tenant = await get_tenant(session, tenant_id=args.tenant_id)
    member = await _find(session, args.tenant_id, args.member)
    ttl = timedelta(minutes=settings.login_link_ttl_minutes)
    url, _ = await members.issue_login_link(session, member=member, base_url=base, ttl=ttl)
    await _print_link(settings, email=member.email, url=url, tenant_name=tenant.name)
