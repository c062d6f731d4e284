"""Where a webhook may be sent: a tenant's URL must not reach the operator's own network.

A receiver is resolved when each attempt is made (a name that resolved to a public address when it was
saved may point at 127.0.0.1 later), and an attempt to a loopback, private, link-local, shared, reserved,
multicast or unspecified address is refused without connecting. KVGATE_ALERTS_ALLOW_PRIVATE_WEBHOOKS lifts
this for an operator whose receivers live on their own network (and for tests on loopback).

Left open: the name is resolved again by the HTTP client when it connects, so a DNS server answering
differently within those milliseconds (rebinding) is not stopped; pinning the address needs a transport
of our own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def literal_address(host: str) -> str | None:
    """The host if it is an IP address literal (IPv6 without its brackets), else None."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


async def private_address(host: str, port: int) -> str | None:
    """The first resolved address of host that is not public (None: all are public); OSError if none resolves."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for *_, sockaddr in infos:
        address = str(sockaddr[0])
        if not is_public(address):
            return address
    return None
