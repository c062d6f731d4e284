from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inference.clock import ManualClock
from inference.engine import Engine
from inference.settings import EngineSettings

EngineFactory = Callable[..., Engine]


@pytest.fixture
def make_engine() -> EngineFactory:
    """Engines on a manual clock; settings overrides as keyword arguments."""

    def make(model: Path | str, **overrides: Any) -> Engine:
        settings = EngineSettings(model=str(model), **{"dtype": "float32", "kv_cache_gib": 0.02, **overrides})
        return Engine(settings, clock=ManualClock(start=1_000_000.0))

    return make


@pytest.fixture
def tiny_engine(make_engine: EngineFactory, tiny_llama_dir: Path) -> Engine:
    return make_engine(tiny_llama_dir)
