"""One request of an EnginePool: routed, and failed over to another engine while nothing was sent.

Before the first delta is handed out, an engine that cannot take the request (its connection
fails, it answers 503/429, it ends the request "unavailable") is skipped and the request goes to
the next choice among the engines not tried yet; one whose connection failed is also taken out
of the pool until a probe answers. After the first delta nothing is retried (the client has
output from that engine): the request ends "error" (unavailable) with the usage of what was sent,
which the gateway turns into its API's error event and a usage record of those counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.backends.base import Placement
from gateway.backends.http import HttpHandle
from gateway.backends.queued_handle import QueuedHandle
from inference.types import CacheSpec, EngineError, FairShare, InvalidRequestError, RequestOutput, SamplingParams

if TYPE_CHECKING:
    from gateway.backends.engine_health import Member
    from gateway.backends.pool import EnginePool


class PoolHandle(QueuedHandle):
    def __init__(
        self,
        pool: EnginePool,
        request_id: str,
        prompt_token_ids: tuple[int, ...],
        params: SamplingParams,
        cache: CacheSpec,
        share: FairShare | None = None,
    ) -> None:
        super().__init__(request_id, prompt_token_ids)
        self.pool = pool
        self.params = params
        self.cache = cache
        self.share = share
        self.attempts: list[str] = []  # engine URLs tried, in order
        self._inner: HttpHandle | None = None
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True
        if self._inner is not None:
            self._inner.cancel()  # its "cancelled" output, with its usage so far, comes back through _run
        else:
            super().cancel()

    async def _run(self) -> RequestOutput:
        try:
            return await self._route()
        finally:
            self.pool.forget(self.request_id)

    async def _route(self) -> RequestOutput:
        hashes = self.pool.block_hashes(self.prompt_token_ids, self.cache.salt)
        last_error = self.pool.unavailable_reason()
        while not self._cancelled:
            chosen = self.pool.choose(hashes, self.cache, exclude=set(self.attempts))
            if chosen is None:
                break
            member, decision = chosen
            self.attempts.append(member.url)
            block_size = self.pool.hasher.block_size if self.pool.hasher is not None else 16
            predicted = decision.predicted_hit_blocks * block_size
            self.placement = Placement(
                member.engine.info.flavour if member.engine.info else "kvgate", member.engine_id, predicted
            )
            try:
                inner = member.engine.submit(
                    self.prompt_token_ids,
                    self.params,
                    self.cache,
                    self.request_id,
                    share=self.share,
                    predicted_cached_tokens=predicted,
                )
            except InvalidRequestError as exc:
                return self.output("error", error=str(exc), kind="invalid_request")
            except EngineError as exc:
                last_error = str(exc)
                continue
            output = await self._relay(member, inner, queued=max(len(self.prompt_token_ids) - predicted, 0))
            retry = output.finish_reason == "error" and output.error_kind == "unavailable" and not inner.sent_any
            if not retry or self._cancelled:
                # The engine's own count beside the prediction; an attempt that failed over read nothing
                # and is not counted (its prediction would look like a miss).
                self.pool.record_actual(decision, output.usage.cached_tokens // block_size)
                return self.relayed(output, started_after_s=inner.started_at - self.started_at)
            last_error = output.error or "the engine failed"
            if inner.transport_failed:
                self.pool.connection_failed(member, last_error)
        if self._cancelled:
            return self.output("cancelled")
        return self.output("error", error=f"no engine could take the request ({last_error})", kind="unavailable")

    async def _relay(self, member: Member, inner: HttpHandle, *, queued: int) -> RequestOutput:
        """Pass the engine's deltas on, keeping its load current, and return its output."""
        self._inner = inner
        member.active += 1
        member.queued_prefill_tokens += queued
        prefilling = True
        try:
            async for delta in inner:
                if prefilling:
                    member.queued_prefill_tokens -= queued
                    prefilling = False
                    self.prompt_usage = inner.prompt_usage  # set before the first delta, by HttpHandle
                self._emit(delta)
            return await inner.result()
        finally:
            member.active -= 1
            if prefilling:
                member.queued_prefill_tokens -= queued
            self._inner = None
