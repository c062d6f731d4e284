"""Engines with KV tiers, closed (their disk tier released) at the end of each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.engine import Engine
from tests.inference.conftest import EngineFactory

TieredFactory = Callable[..., Engine]


@pytest.fixture
def tiered(make_engine: EngineFactory, tmp_path: Path) -> Iterator[TieredFactory]:
    """tiered(model_dir, device=N, host=N, disk=N, **settings): tier sizes in blocks; disk in tmp_path/kv."""
    engines: list[Engine] = []

    def make(
        model_dir: Path, *, device: int = 16, host: int = 0, disk: int = 0, disk_dir: Path | None = None, **kw: Any
    ) -> Engine:
        overrides: dict[str, Any] = {"kv_cache_blocks": device, "kv_host_blocks": host, **kw}
        if disk:
            overrides |= {"kv_disk_dir": disk_dir or tmp_path / "kv", "kv_disk_blocks": disk}
        engine = make_engine(model_dir, **overrides)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
