"""`kvgate members invite|list|remove|link`: a tenant's dashboard members, on the database directly.

Like `kvgate keys`, these need no running server: the changes migrate the database first, `list` never
creates one and prints the admin API's MemberOut (`--output table|json|csv`). `invite` and `link`
print the single-use login link on stdout (and mail it when KVGATE_SMTP_URL is set).
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Annotated, Any

import httpx
import typer
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.settings import GatewaySettings
from kvgate.cli_database import Sessions, run_on_database
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit
from kvgate.errors import NotFoundError
from kvgate.tenancy import MEMBER_ROLES
from web import members
from web.mail import MAIL_ERRORS, send_login_link
from web.settings import WebSettings, public_url

MEMBER_COLUMNS = (
    "id",
    "email",
    "role",
    Column("last_login_at", header="last login", value=lambda member: member.last_login_at or "never"),
    "created_at",
)
MemberArg = Annotated[str, typer.Argument(help="the member's id or email")]


def register(app: typer.Typer) -> None:
    """Add `members invite|list|remove|link` to the `kvgate` command."""
    group = typer.Typer(help="Manage a tenant's dashboard members.", no_args_is_help=True)
    app.add_typer(group, name="members")

    @group.command("invite")
    def invite(
        tenant_id: str,
        email: str,
        role: Annotated[str, typer.Option(help=f"one of {', '.join(MEMBER_ROLES)}")] = "viewer",
    ) -> None:
        """Invite a member and print their single-use login link."""
        if role not in MEMBER_ROLES:
            raise ValueError(f"unknown role {role!r}: give one of {', '.join(MEMBER_ROLES)}")
        run_on_database(lambda sessions: _in_session(sessions, _invite, tenant_id, email, role), write=True)

    @group.command("list")
    def list_(tenant_id: str, output: OutputOption = OutputFormat.table) -> None:
        """List a tenant's members."""
        from web.admin_api import MemberOut  # the admin API's model, so --output json matches it

        rows = run_on_database(lambda sessions: _in_session(sessions, _list, tenant_id), write=False)
        emit(rows, fmt=output, columns=MEMBER_COLUMNS, model=MemberOut)

    @group.command("remove")
    def remove(tenant_id: str, member: MemberArg) -> None:
        """Remove a member (ends their sessions)."""
        run_on_database(lambda sessions: _in_session(sessions, _remove, tenant_id, member), write=True)

    @group.command("link")
    def link(tenant_id: str, member: MemberArg) -> None:
        """Print a new login link for a member."""
        run_on_database(lambda sessions: _in_session(sessions, _link, tenant_id, member), write=True)


async def _in_session(sessions: Sessions, action: Any, *args: Any) -> Any:
    async with sessions() as session:
        return await action(session, *args)


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
    """Where the links point. Without KVGATE_PUBLIC_URL the CLI only knows KVGATE_HOST and KVGATE_PORT
    as its own shell sees them, which need not be the server's: it asks that address for a kvgate
    and says so when none answers (the link would be dead)."""
    web, gateway = WebSettings(), GatewaySettings()
    url = public_url(web, host=gateway.host, port=gateway.port)
    if not web.public_url and not _answers(url):
        print(
            f"warning: no kvgate answers at {url}, so this link may not work: the CLI takes the address "
            "from KVGATE_HOST and KVGATE_PORT as this shell sees them. Set KVGATE_PUBLIC_URL (and KVGATE_PORT) "
            "in .env, which both the server and the CLI read, so they agree.",
            file=sys.stderr,
        )
    return web, url


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


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


async def _invite(session: AsyncSession, tenant_id: str, email: str, role: str) -> None:
    from gateway.services.tenants import get_tenant

    settings, base = _base_url()
    tenant = await get_tenant(session, tenant_id=tenant_id)
    ttl = timedelta(minutes=settings.login_link_ttl_minutes)
    invitation = await members.invite_with_link(
        session, tenant_id=tenant.id, email=email, role=role, base_url=base, ttl=ttl
    )
    member = invitation.member
    print(
        f"{member.email} ({member.role}) can log in to {tenant.name} once, within "
        f"{settings.login_link_ttl_minutes:g} minutes, with:",
        file=sys.stderr,
    )
    await _print_link(settings, email=member.email, url=invitation.login_url, tenant_name=tenant.name)


async def _list(session: AsyncSession, tenant_id: str) -> list[Any]:
    from gateway.services.tenants import get_tenant
    from web.admin_api import MemberOut  # the admin API's model, so --output json matches it

    await get_tenant(session, tenant_id=tenant_id)  # an unknown tenant is an error, not an empty list
    return [MemberOut.model_validate(m) for m in await members.list_members(session, tenant_id=tenant_id)]


async def _remove(session: AsyncSession, tenant_id: str, member_ref: str) -> None:
    member = await _find(session, tenant_id, member_ref)
    await members.remove_member(session, tenant_id=tenant_id, member_id=member.id)
    print(f"removed {member.email} from tenant {tenant_id}; their sessions have ended")


async def _link(session: AsyncSession, tenant_id: str, member_ref: str) -> None:
    from gateway.services.tenants import get_tenant

    settings, base = _base_url()
    tenant = await get_tenant(session, tenant_id=tenant_id)
    member = await _find(session, tenant_id, member_ref)
    ttl = timedelta(minutes=settings.login_link_ttl_minutes)
    url, _ = await members.issue_login_link(session, member=member, base_url=base, ttl=ttl)
    await _print_link(settings, email=member.email, url=url, tenant_name=tenant.name)
