"""Small helpers shared by the server tests."""

from __future__ import annotations

import random
import uuid


def token_prompt(n: int, seed: int) -> list[int]:
    """n random ordinary token ids: a prompt no other test shares."""
    rng = random.Random(seed)
    return [rng.randrange(100, 40_000) for _ in range(n)]


def unique_salt() -> str:
    return f"test-{uuid.uuid4().hex}"


def expected_hit(prompt_len: int, block_size: int = 16) -> int:
    """Tokens a repeat reads: full blocks, never the one holding the last prompt token."""
    return (prompt_len - 1) // block_size * block_size
