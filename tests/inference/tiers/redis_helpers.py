"""Helpers for the Redis tier tests (their fixtures, `shared` and `redis_client`, are in conftest.py)."""

from __future__ import annotations

import socket

from inference.engine import Engine
from inference.tiers.redis_tier import RedisTier

REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_tier(engine: Engine) -> RedisTier:
    assert engine.tiers is not None
    tier = engine.tiers.tier("redis")
    assert isinstance(tier, RedisTier)
    return tier


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
