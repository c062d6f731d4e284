"""The engine client `kvgate serve` runs, from KVGATE_ENGINES: the embedded engine, or a pool of remote ones."""

from __future__ import annotations

from gateway.backends.base import EngineClient
from gateway.backends.embedded import EmbeddedEngine
from gateway.settings import GatewaySettings
from inference.settings import EngineSettings


def engine_client(settings: GatewaySettings, engine_settings: EngineSettings | None = None) -> EngineClient:
    """EmbeddedEngine (KVGATE_ENGINES=embedded), else an EnginePool over the URLs with KVGATE_MODEL's tokenizer only,
    routed by the cache-aware router (fed by KV events with KVGATE_NATS_URL: gateway.backends.pool_routing).

    engine_settings: the engine's (KVGATE_MODEL...), read from the environment unless given."""
    specs = settings.engine_specs
    if specs is None:
        return EmbeddedEngine.from_settings(engine_settings)
    from gateway.backends.pool import EnginePool
    from gateway.backends.pool_routing import PoolRouting
    from gateway.backends.served_model import ServedModel

    engine_settings = engine_settings or EngineSettings()
    secret = engine_settings.engine_token
    token = secret.get_secret_value() if secret is not None else None
    return EnginePool(
        specs,
        model=ServedModel.load(engine_settings),
        engine_token=token,
        routing=PoolRouting(settings, engine_token=token),
        start_wait_s=settings.engines_start_wait_s,
        vllm_block_size=settings.vllm_block_size,
        read_timeout_s=settings.engine_read_timeout_s,
    )
