"""A remote engine over HTTP as an EngineClient: `kvgate engine serve` or vLLM's OpenAI server.

Each request is one streamed POST /v1/completions (gateway.backends.http_wire): the prompt as
token ids, the tenant's salt as `cache_salt`, kvgate's `cache_regions` where the engine is
kvgate's. The handle sets prompt_usage from the first chunk that carries it, before handing out
the first delta; for a vLLM engine (which reports no cache counts until the end) it is the router's
predicted reads and the writes they imply until then (shown in a stream's first event, never billed).
result() carries the engine's final counts (derived writes for vLLM). A vLLM engine's block size is
the one its /metrics publishes (http_wire.vllm_block_size).

A connection that fails or breaks ends the request "error" with error_kind "unavailable" and the
usage of what was sent (transport_failed says it was the connection, not an HTTP answer): the pool
(gateway.backends.pool) fails it over to another engine when nothing was sent yet.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import urljoin

import httpx

from gateway.backends.base import Placement
from gateway.backends.http_wire import (
    Flavour,
    WireError,
    completion_body,
    kvgate_usage,
    parse_chunk,
    published_block_size,
    vllm_block_size,
    vllm_start_usage,
    vllm_usage,
)
from gateway.backends.queued_handle import QueuedHandle
from gateway.backends.served_model import ServedModel
from inference.stats import EngineStats
from inference.types import (
    CacheSpec,
    EngineError,
    EngineUnavailableError,
    ErrorKind,
    FairShare,
    RequestOutput,
    SamplingParams,
    TokenDelta,
    Usage,
)

CONNECT_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 5.0


class EngineMismatchError(EngineError):
    """The engine serves another model than the gateway's, or is not an engine at all: a configuration error."""


class EngineInfo(NamedTuple):
    """What the gateway learns of an engine when it first answers."""

    engine_id: str  # /kv/info's engine_id; the base URL where there is none (vLLM)
    model_id: str
    max_model_len: int
    flavour: Flavour
    block_size: int
    hash_algo: str
    kv_events_subject: str | None = None  # where its KV events go; None: it publishes none (vLLM: always)
    shared_tier: bool = False  # it reads and writes the shared (Redis) KV tier


def error_kind_of(status: int) -> ErrorKind:
    """400-class answers are the request's fault (the same everywhere); 5xx and 429 are the engine's state."""
    if status in (408, 429) or status >= 502:
        return "unavailable"
    return "invalid_request" if 400 <= status < 500 else "internal"


class HttpEngine:
    """One engine base URL. start() checks its model against `model`; submit() streams one completion."""

    def __init__(
        self,
        base_url: str,
        *,
        model: ServedModel,
        vllm_block_size: int | None = None,
        read_timeout_s: float = 600.0,
        client: httpx.AsyncClient | None = None,
        token: str | None = None,
    ) -> None:
        """token: the engine's KVGATE_ENGINE_TOKEN (or vLLM's --api-key), sent as a bearer token on every call.
        vllm_block_size: KVGATE_VLLM_BLOCK_SIZE (None: what a vLLM engine publishes; http_wire.vllm_block_size)."""
        self.base_url = base_url.rstrip("/") + "/"
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self.model = model
        self.vllm_block_size = vllm_block_size
        self.info: EngineInfo | None = None
        self._client = client
        self._own_client = client is None
        self._read_timeout_s = read_timeout_s
        self._handles: dict[str, HttpHandle] = {}

    # -- EngineClient -----------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self.model.model_id

    @property
    def max_model_len(self) -> int:
        assert self.info is not None, "HttpEngine.start() has not run"
        return self.info.max_model_len

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def engine_id(self) -> str:
        return self.info.engine_id if self.info is not None else self.base_url.rstrip("/")

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> str:
        return self.model.apply_chat_template(messages, tools=tools)

    async def start(self) -> None:
        """Learn the engine (describe()); EngineUnavailableError if it does not answer, EngineMismatchError
        if it serves another model."""
        self.info = await self.describe()

    async def shutdown(self, timeout_s: float | None = None) -> None:
        for handle in list(self._handles.values()):
            handle.cancel()
        if self._handles:
            await asyncio.wait([asyncio.ensure_future(h.result()) for h in self._handles.values()], timeout=timeout_s)
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def prepare(self, params: SamplingParams, *, share: FairShare | None = None) -> None:
        """Nothing here: the remote engine compiles the request's grammar itself, off its loop."""

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
        share: FairShare | None = None,
        predicted_cached_tokens: int = 0,
    ) -> HttpHandle:
        """predicted_cached_tokens: what the router expects a vLLM engine to read (see HttpHandle._deliver)."""
        if self.info is None:
            raise EngineUnavailableError(f"the engine at {self.base_url} has not answered yet")
        request_id = request_id or f"http-{uuid.uuid4().hex}"
        body = completion_body(
            model=self.info.model_id,
            prompt_token_ids=prompt_token_ids,
            params=params,
            cache=cache,
            flavour=self.info.flavour,
            share=share,
        )
        handle = HttpHandle(self, request_id, tuple(prompt_token_ids), cache, body, predicted_cached_tokens)
        self._handles[request_id] = handle
        handle.start()
        return handle

    def abort(self, request_id: str) -> None:
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.cancel()

    async def check_health(self) -> None:
        """EngineUnavailableError unless GET /health answers 200 (kvgate's and vLLM's health endpoint)."""
        try:
            response = await self.client.get(self._url("health"), timeout=PROBE_TIMEOUT_S, headers=self._headers)
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"the engine at {self.base_url} does not answer: {exc!r}") from exc
        if response.status_code != 200:
            raise EngineUnavailableError(f"the engine at {self.base_url} is unhealthy ({response.status_code})")

    def stats(self) -> EngineStats | None:
        return None  # the engine's own /metrics has them

    # -- what the pool uses -----------------------------------------------------------------

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(self._read_timeout_s, connect=CONNECT_TIMEOUT_S)
            self._client = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=None))
        return self._client

    @property
    def in_flight(self) -> int:
        return len(self._handles)

    def _url(self, path: str) -> str:
        return urljoin(self.base_url, path)

    async def describe(self) -> EngineInfo:
        """GET /v1/models (the model must be ours) and GET /kv/info (kvgate engines; a 404 means none)."""
        try:
            models = await self.client.get(self._url("v1/models"), timeout=PROBE_TIMEOUT_S, headers=self._headers)
            kv_info = await self.client.get(self._url("kv/info"), timeout=PROBE_TIMEOUT_S, headers=self._headers)
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"the engine at {self.base_url} does not answer: {exc!r}") from exc
        if models.status_code != 200:
            raise EngineUnavailableError(f"the engine at {self.base_url} answers /v1/models with {models.status_code}")
        try:
            cards = models.json()["data"]
            ids = [card["id"] for card in cards]
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineMismatchError(f"{self.base_url} is not an OpenAI-compatible engine: {exc!r}") from exc
        if self.model_id not in ids:
            raise EngineMismatchError(
                f"the engine at {self.base_url} serves {ids}, the gateway serves {self.model_id!r}: run the engines "
                "and the gateway with the same KVGATE_MODEL (and KVGATE_SERVED_MODEL_NAME)"
            )
        card = cards[ids.index(self.model_id)]
        flavour: Flavour = "kvgate" if card.get("owned_by") == "kvgate" else "vllm"
        try:
            info = kv_info.json() if kv_info.status_code == 200 else {}
        except ValueError:
            info = {}
        if not isinstance(info, dict):
            info = {}
        block_size = int(info.get("block_size") or 16) if flavour == "kvgate" else await self._vllm_block_size()
        return EngineInfo(
            engine_id=str(info.get("engine_id") or self.base_url.rstrip("/")),
            model_id=self.model_id,
            max_model_len=int(card.get("max_model_len") or 0) or 2048,
            flavour=flavour,
            block_size=block_size,
            hash_algo=str(info.get("hash_algo") or "sha256"),
            kv_events_subject=str(info["kv_events_subject"]) if info.get("kv_events_subject") else None,
            shared_tier=bool(info.get("shared_tier")),
        )

    async def _vllm_block_size(self) -> int:
        """The block size a vLLM engine's /metrics publishes, checked against KVGATE_VLLM_BLOCK_SIZE."""
        try:
            metrics = await self.client.get(self._url("metrics"), timeout=PROBE_TIMEOUT_S, headers=self._headers)
            text = metrics.text if metrics.status_code == 200 else ""
        except httpx.HTTPError:
            text = ""  # no /metrics: the configured size, else the default
        try:
            return vllm_block_size(published=published_block_size(text), configured=self.vllm_block_size)
        except WireError as exc:
            raise EngineMismatchError(f"the vLLM engine at {self.base_url} {exc}") from exc

    def _forget(self, request_id: str) -> None:
        self._handles.pop(request_id, None)


class HttpHandle(QueuedHandle):
    """One streamed completion on one engine."""

    def __init__(
        self,
        engine: HttpEngine,
        request_id: str,
        prompt_token_ids: tuple[int, ...],
        cache: CacheSpec,
        body: dict,
        predicted_cached_tokens: int = 0,
    ) -> None:
        super().__init__(request_id, prompt_token_ids)
        assert engine.info is not None
        self.engine = engine
        self.info = engine.info
        self.cache = cache
        self.body = body
        self.predicted_cached_tokens = predicted_cached_tokens
        self.placement = Placement(self.info.flavour, self.info.engine_id)
        self.transport_failed = False  # the connection failed or broke (the engine is likely down)
        self.sent_any = False  # a delta was handed out
        self._completion_tokens = 0
        self._ttft_s: float | None = None

    def _usage_so_far(self) -> Usage:
        known = self.prompt_usage if self.info.flavour == "kvgate" else None  # vLLM's is a prediction: not billed
        prompt = known or Usage(len(self.prompt_token_ids), 0, 0, 0)
        return Usage(
            prompt.prompt_tokens,
            prompt.cached_tokens,
            prompt.cache_write_tokens,
            self._completion_tokens,
            dict(prompt.cached_tokens_by_tier),
            dict(prompt.cache_write_tokens_by_ttl),
        )

    async def _run(self) -> RequestOutput:
        try:
            return await self._stream()
        except (httpx.HTTPError, OSError) as exc:
            self.transport_failed = True
            where = "mid-stream" if self.sent_any else "before the first token"
            message = f"the engine at {self.engine.base_url} failed {where}: {exc!r}"
            return self.output("error", error=message, kind="unavailable", ttft_s=self._ttft_s)
        except WireError as exc:
            return self.output("error", error=str(exc), kind="internal", ttft_s=self._ttft_s)
        finally:
            self.engine._forget(self.request_id)

    async def _stream(self) -> RequestOutput:
        prompt_tokens = len(self.prompt_token_ids)
        final: Usage | None = None
        finish: str | None = None
        stop_sequence: str | None = None
        async with self.engine.client.stream(
            "POST", self.engine._url("v1/completions"), json=self.body, headers=self.engine._headers
        ) as response:
            if response.status_code != 200:
                message = (await response.aread()).decode(errors="replace")[:500]
                return self.output(
                    "error",
                    error=f"the engine answered {response.status_code}: {message}",
                    kind=error_kind_of(response.status_code),
                )
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = parse_chunk(data)
                if chunk.error is not None:
                    kind = error_kind_of(chunk.error_status or 500)
                    return self.output("error", error=chunk.error, kind=kind, ttft_s=self._ttft_s)
                if chunk.final_usage:
                    final = self._final_usage(chunk.usage or {}, prompt_tokens)
                elif chunk.usage is not None and self.prompt_usage is None and self.info.flavour == "kvgate":
                    self.prompt_usage = kvgate_usage(chunk.usage, prompt_tokens=prompt_tokens, completion=False)
                if chunk.text:
                    self._deliver(chunk.text, chunk.usage)
                if chunk.finish_reason is not None:
                    finish = chunk.finish_reason
                    if finish == "stop" and isinstance(chunk.stop_reason, str):
                        stop_sequence = chunk.stop_reason
        if finish is None or final is None:
            raise WireError(f"the engine at {self.engine.base_url} ended the stream without a finish and its usage")
        if finish not in ("stop", "length"):
            # vLLM's "abort": the engine dropped the request (shutting down, preempted out).
            return self.output("error", error=f"the engine ended the request: {finish}", kind="unavailable")
        return self.output(
            finish,  # type: ignore[arg-type]
            usage=final,
            stop_sequence=stop_sequence,
            ttft_s=self._ttft_s,
        )

    def _final_usage(self, usage: dict[str, Any], prompt_tokens: int) -> Usage:
        if self.info.flavour == "vllm":
            return vllm_usage(usage, prompt_tokens=prompt_tokens, cache=self.cache, block_size=self.info.block_size)
        final = kvgate_usage(usage, prompt_tokens=prompt_tokens)
        if final is None:
            raise WireError("the kvgate engine's final usage has no prompt_tokens_details")
        return final

    def _deliver(self, text: str, usage: dict[str, Any] | None) -> None:
        if self.prompt_usage is None and self.info.flavour == "vllm":
            # vLLM counts its cache only in the final usage: until then (for a stream's first event, Anthropic's
            # message_start) the router's predicted reads and the writes they imply; the final usage is billed.
            self.prompt_usage = vllm_start_usage(
                prompt_tokens=len(self.prompt_token_ids),
                predicted_cached=self.predicted_cached_tokens,
                cache=self.cache,
                block_size=self.info.block_size,
            )
        elif self.prompt_usage is None:
            self.prompt_usage = Usage(len(self.prompt_token_ids), 0, 0, 0)
        # continuous_usage_stats: completion_tokens counts the tokens up to and with this text.
        reported = usage.get("completion_tokens") if usage else None
        self._completion_tokens = reported if isinstance(reported, int) else self._completion_tokens + 1
        if self._ttft_s is None:
            self._ttft_s = self.elapsed_s
        self.sent_any = True
        self._emit(TokenDelta((), text))
