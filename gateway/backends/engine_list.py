"""KVGATE_ENGINES: `embedded` (the default: the engine runs inside the gateway) or remote engine URLs.

Syntax: a comma-separated list of engine base URLs, each optionally followed by `=WEIGHT` (a
positive number, default 1): `http://10.0.0.5:8001=2,http://10.0.0.6:8001`. A URL is http or
https with a host, and no query or fragment; the same URL twice is an error. Whitespace around
items is ignored. Weights bias the router (gateway.routing.least_loaded): an engine of weight 2
takes twice the load of one of weight 1.
"""

from __future__ import annotations

import math
from typing import NamedTuple
from urllib.parse import urlsplit

EMBEDDED = "embedded"


class EngineSpec(NamedTuple):
    url: str  # without a trailing slash
    weight: float = 1.0


def parse_engines(value: str) -> tuple[EngineSpec, ...] | None:
    """None for `embedded`; else the engines. ValueError with a message naming the bad item."""
    text = value.strip()
    if text.lower() == EMBEDDED:
        return None
    if not text:
        raise ValueError("KVGATE_ENGINES is empty: set it to `embedded` or to engine URLs")
    specs: list[EngineSpec] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"KVGATE_ENGINES has an empty item in {value!r}")
        specs.append(_parse_item(item))
    urls = [spec.url for spec in specs]
    duplicates = sorted({url for url in urls if urls.count(url) > 1})
    if duplicates:
        raise ValueError(f"KVGATE_ENGINES lists {', '.join(duplicates)} more than once")
    return tuple(specs)


def _parse_item(item: str) -> EngineSpec:
    url, sep, weight_text = item.rpartition("=")
    if not sep:
        url, weight = item, 1.0
    else:
        try:
            weight = float(weight_text)
        except ValueError:
            raise ValueError(f"KVGATE_ENGINES: the weight in {item!r} is not a number") from None
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"KVGATE_ENGINES: the weight in {item!r} must be a positive number")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"KVGATE_ENGINES: {url!r} is not an http(s) URL with a host (e.g. http://127.0.0.1:8001)")
    if parts.query or parts.fragment:
        raise ValueError(f"KVGATE_ENGINES: {url!r} has a query or fragment; give the engine's base URL")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError as exc:
        raise ValueError(f"KVGATE_ENGINES: {url!r} has a bad port ({exc})") from None
    return EngineSpec(url.rstrip("/"), weight)
