"""`kvgate serve`'s check of KVGATE_ENGINES before anything loads: one engine answers, and serves our model.

A failure is one line (kvgate.preflight.StartupError) naming the engine and the fix, before the
tokenizer loads and uvicorn starts; the pool's own start() checks the same again, and keeps
checking engines that join later.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import httpx

from gateway.backends.engine_list import EngineSpec
from kvgate.preflight import StartupError


def check_engines(specs: Sequence[EngineSpec], model_id: str, *, wait_s: float) -> list[str]:
    """The URLs that answered with `model_id`, once any does (retrying up to wait_s); StartupError if one
    serves another model, or if none answers in time."""
    deadline = time.monotonic() + wait_s
    while True:
        answered: list[str] = []
        problems: list[str] = []
        for spec in specs:
            try:
                response = httpx.get(f"{spec.url}/v1/models", timeout=5)
                ids = [card.get("id") for card in response.json().get("data", [])] if response.is_success else None
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                problems.append(f"{spec.url}: {type(exc).__name__}")
                continue
            if ids is None:
                problems.append(f"{spec.url}: /v1/models answered {response.status_code}")
            elif model_id not in ids:
                raise StartupError(
                    f"the engine at {spec.url} serves {', '.join(map(str, ids)) or 'no model'}, this gateway "
                    f"{model_id}: give the gateway the engines' KVGATE_MODEL (and KVGATE_SERVED_MODEL_NAME)"
                )
            else:
                answered.append(spec.url)
        if answered:
            return answered
        if time.monotonic() >= deadline:
            raise StartupError(
                f"no engine of KVGATE_ENGINES answers ({'; '.join(problems)}): start them (kvgate engine serve), "
                "fix the URLs, or wait longer (KVGATE_ENGINES_START_WAIT_S)"
            )
        time.sleep(0.5)
