"""The synchronous engine core: requests in, one batched step at a time, token outputs out."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import structlog
import torch

from inference.block_pool import BlockPool
from inference.clock import Clock, SystemClock
from inference.cpu_threads import default_num_threads
from inference.detokenizer import IncrementalDetokenizer
from inference.hashing import BlockHasher
from inference.kernels import load_kernels, plan_for
from inference.kv_cache_manager import KVCacheManager, commit_ttls, split_points
from inference.kv_event_log import KVEventLog, Probe
from inference.kv_event_publisher import KVEventPublisher
from inference.model_fingerprint import model_fingerprint
from inference.model_loader import LoadedModel, load_model
from inference.model_runner import Chunk, ModelRunner
from inference.paged_attention import KVTensors
from inference.request import Request, RequestStatus
from inference.sampler import make_generator, sample
from inference.scheduler import ScheduledChunk, Scheduler
from inference.settings import EngineSettings
from inference.structured import StructuredOutputs
from inference.tiers import TierManager
from inference.types import (
    MAX_TTL_S,
    SEED_MAX,
    SEED_MIN,
    CacheSpec,
    ErrorKind,
    FairShare,
    FinishReason,
    InvalidRequestError,
    RequestOutput,
    SamplingParams,
    StructuredOutput,
    Usage,
)
from kvgate import kv_events

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class StepOutput:
    """What one step produced for one request: new tokens and text, and the result once finished."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    finished: RequestOutput | None = None
    # With the first token: the prompt's cache counts, final from then on (every
    # committable prompt block is committed before the first token is sampled).
    prompt_usage: Usage | None = None


@dataclass(eq=False)
class _Tracked:
    request: Request
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    max_tokens: int
    eos_token_ids: frozenset[int]
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    structured: bool = False  # has a grammar matcher in Engine.structured


@dataclass
class _Masks:
    """A step's grammar masks, being computed on the mask thread for these request ids."""

    ids: list[str]
    future: Future[torch.Tensor]

    def take(self) -> torch.Tensor | None:
        """The masks; None if computing them raised (the rows then compute theirs again, and fail there)."""
        try:
            return self.future.result()
        except Exception:
            return None


class Engine:
    def __init__(
        self, settings: EngineSettings, *, clock: Clock | None = None, loaded: LoadedModel | None = None
    ) -> None:
        threads = settings.num_threads or default_num_threads()
        if threads:
            torch.set_num_threads(threads)
        self.settings = settings
        self.clock = clock or SystemClock()
        self.loaded = loaded or load_model(settings)
        cfg = self.loaded.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.block_size = settings.block_size
        per_block = KVTensors.bytes_per_block(
            num_layers=cfg.num_hidden_layers,
            block_size=self.block_size,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=head_dim,
            dtype=self.loaded.dtype,
        )
        num_blocks = settings.kv_cache_blocks or int(settings.kv_cache_gib * 2**30) // per_block
        if num_blocks < 2:
            raise ValueError(f"KVGATE_KV_CACHE_GIB={settings.kv_cache_gib} holds fewer than 2 blocks")
        self.kv_tensors = KVTensors(
            num_layers=cfg.num_hidden_layers,
            num_blocks=num_blocks,
            block_size=self.block_size,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=head_dim,
            dtype=self.loaded.dtype,
            device=self.loaded.device,
        )
        self.plan = plan_for(settings, self.loaded, head_dim=head_dim)
        kernels = load_kernels(self.plan, settings.cache_dir, decode_spin_us=settings.decode_spin_us)
        self.tiers = TierManager.from_settings(
            settings,
            self.kv_tensors.cache,
            self.clock,
            model_fingerprint=self._fingerprint(settings),
            compute=self.plan.digest(),
        )
        self.pool = BlockPool(
            num_blocks,
            on_evict=self.tiers.on_device_evict if self.tiers is not None else None,
            pin_min_ttl_s=settings.kv_pin_min_ttl_s,
            pin_share=settings.kv_pin_share,
        )
        self.hasher = BlockHasher(model_id=self.loaded.model_id, block_size=self.block_size, algo=settings.hash_algo)
        self.kv = KVCacheManager(pool=self.pool, hasher=self.hasher, clock=self.clock, tiers=self.tiers)
        self.engine_id = settings.resolved_engine_id()
        # KV events, when a NATS server is set (its publisher attaches as the log's sink).
        self.kv_events: KVEventLog | None = None
        self.kv_event_publisher: KVEventPublisher | None = None  # set by kv_event_publisher.attach_publisher
        self._kv_probes: dict[str, Probe] = {}
        if settings.nats_url:
            self._collect_kv_events()
        self.scheduler = Scheduler(
            kv=self.kv,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            fair_prefill_quantum=settings.fair_prefill_quantum,
            contended_prefill_tokens=settings.contended_prefill_tokens,
        )
        self.runner = ModelRunner(self.loaded.model, self.kv_tensors, kernels)
        self.vocab_size = int(cfg.vocab_size)
        self.structured = StructuredOutputs(
            self.loaded.tokenizer, vocab_size=self.vocab_size, eos_token_ids=self.loaded.eos_token_ids
        )
        self._tracked: dict[str, _Tracked] = {}
        # Tests hook this to see the float32 logits each sampled token came from.
        self.logits_observer: Callable[[list[str], torch.Tensor], None] | None = None
        log.info(
            "engine_ready",
            model=self.model_id,
            dtype=str(self.loaded.dtype),
            device=str(self.loaded.device),
            kv_blocks=num_blocks,
            block_size=self.block_size,
            kernel_plan=self.plan.describe(),
            kernel_plan_digest=self.plan.digest(),
        )

    def _collect_kv_events(self) -> None:
        """Report every block of every medium to a KVEventLog: AllBlocksCleared first, then what the tiers
        hold already (the disk's blocks from before a restart)."""
        log = KVEventLog(engine_id=self.engine_id, block_size=self.block_size)
        medium = "GPU" if self.loaded.device.type == "cuda" else "CPU"
        self.pool.attach_events(log, medium)
        self._kv_probes = {medium: self.pool.expiry}
        if self.tiers is not None:
            self._kv_probes |= self.tiers.attach_events(log)
        self.kv_events = log

    @property
    def kv_events_subject(self) -> str | None:
        """The NATS subject of this engine's KV events; None when it publishes none."""
        return None if self.kv_events is None else kv_events.subject(self.model_id, self.engine_id)

    def kv_events_tick(self, *, sweep: bool = False) -> None:
        """Between steps and when idle: publish expiries due (each sweep interval, or now if sweep), then the
        step's events as one batch."""
        if self.kv_events is None:
            return
        try:
            if sweep:
                self.kv_events.sweep(self.clock.now(), self._kv_probes)
            self.kv_events.tick(self.clock.now(), self._kv_probes)
        except Exception:
            # Events are for routing, which falls back without them: a fault here must not fail requests.
            log.exception("kv_events_tick_failed")

    def _fingerprint(self, settings: EngineSettings) -> str:
        """What a shared KV tier keys blocks by; "" without one (it costs a read of the weights)."""
        if not settings.kv_redis_url:
            return ""
        compute = f"plan={self.plan.digest()}"
        return model_fingerprint(self.loaded.path, dtype=self.loaded.dtype, device=self.loaded.device, compute=compute)

    def close(self) -> None:
        """Write live blocks out to the KV disk tier (if set to) and release it; the engine must not step afterwards."""
        if self.tiers is not None:
            if self.settings.kv_disk_write_out_on_close:
                sent = self.tiers.write_out(self.pool.blocks)
                log.info("kv_write_out_on_close", blocks=sent)
            self.tiers.close()
        if self.kv_events is not None:
            self.kv_events.flush()  # the write-out's stores (the publisher sends them if it can)
        self.structured.close()

    @property
    def model_id(self) -> str:
        return self.loaded.model_id

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.loaded.max_model_len

    # -- requests ------------------------------------------------------------------------

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams, cache: CacheSpec) -> None:
        """Raise InvalidRequestError for a request that can never be served."""
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty")
        if n >= self.max_model_len:
            raise InvalidRequestError(f"the prompt has {n} tokens; this model's context is {self.max_model_len} tokens")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {self.vocab_size})")
        if not isinstance(params.max_tokens, int) or params.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be an integer of at least 1")
        if not isinstance(params.top_k, int):
            raise InvalidRequestError("top_k must be an integer")
        if not math.isfinite(params.temperature) or params.temperature < 0:
            raise InvalidRequestError("temperature must be a finite number >= 0")
        if not 0 < params.top_p <= 1:  # also refuses NaN
            raise InvalidRequestError("top_p must be in (0, 1]")
        if params.top_k < 0:
            raise InvalidRequestError("top_k must be >= 0")
        # Checked here, not only by the servers' schemas, so that no caller can reach a value
        # that raises deep in sampling (torch.Generator.manual_seed overflows past 64 bits).
        if params.seed is not None and not (isinstance(params.seed, int) and SEED_MIN <= params.seed <= SEED_MAX):
            raise InvalidRequestError(f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}]")
        if any(not isinstance(t, int) for t in params.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be integers")
        if any(not isinstance(s, str) for s in params.stop):
            raise InvalidRequestError("stop must be strings")
        for region in cache.regions or ():
            if region.end < 0 or not 0 < region.ttl_s <= MAX_TTL_S:
                raise InvalidRequestError(f"cache regions need end >= 0 and 0 < ttl_s <= {MAX_TTL_S}")
        needed = self.kv.blocks_needed(n + 1)
        if needed > self.pool.num_blocks:
            raise InvalidRequestError(f"the prompt needs {needed} KV blocks; the cache holds {self.pool.num_blocks}")
        if params.structured is not None:
            if not isinstance(params.structured, StructuredOutput):
                raise InvalidRequestError("structured must be a StructuredOutput")
            self.structured.validate(params.structured)  # compiled once, cached for add_request

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        *,
        share: FairShare | None = None,
    ) -> None:
        if request_id in self._tracked:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        self.validate(prompt_token_ids, params, cache)
        prompt = list(prompt_token_ids)
        if not self.settings.enable_prefix_caching:
            cache = CacheSpec(regions=())  # no hashes and no commits: nothing to read or write
        ttls = commit_ttls(
            num_prompt_tokens=len(prompt),
            block_size=self.block_size,
            cache=cache,
            default_ttl_s=self.settings.default_ttl_s,
        )
        request = Request(
            request_id=request_id,
            prompt_token_ids=prompt,
            params=params,
            cache=cache,
            arrival_time=time.monotonic(),
            block_size=self.block_size,
            block_hashes=self.hasher.hash_blocks(prompt, cache.salt) if self.settings.enable_prefix_caching else [],
            commit_ttls=ttls,
            split_points=split_points(
                num_prompt_tokens=len(prompt), block_size=self.block_size, cache=cache, commit_blocks=len(ttls)
            ),
            share=share or FairShare(),
        )
        tracked = _Tracked(
            request=request,
            detokenizer=IncrementalDetokenizer(self.tokenizer, params.stop),
            generator=make_generator(params, self.loaded.device),
            max_tokens=min(params.max_tokens, self.max_model_len - len(prompt)),
            eos_token_ids=frozenset() if params.ignore_eos else frozenset(self.loaded.eos_token_ids),
            stop_token_ids=frozenset(params.stop_token_ids),
            structured=params.structured is not None,
        )
        if params.structured is not None:
            self.structured.open(request_id, params.structured)  # last: nothing below can fail
        # Registered only once everything above has succeeded: a request that fails to build leaves nothing behind.
        self._tracked[request_id] = tracked
        self.scheduler.add(request)

    def abort(
        self,
        request_id: str,
        reason: FinishReason = "cancelled",
        error: str | None = None,
        error_kind: ErrorKind | None = None,
    ) -> StepOutput | None:
        """Stop a request now; it keeps what it committed and reports its usage so far."""
        tracked = self._tracked.get(request_id)
        if tracked is None:
            return None
        if reason == "error":
            return self._fail(tracked, error or "the engine stopped this request", error_kind or "internal")
        return self._finish(tracked, reason, error=error)

    def has_unfinished(self) -> bool:
        return bool(self._tracked)

    @property
    def unfinished_ids(self) -> list[str]:
        return list(self._tracked)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def num_waiting_for(self, key: str) -> int:
        return self.scheduler.waiting.count(key)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # -- stepping ------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        """Schedule, run one forward pass, sample, and report what changed.

        A failure that belongs to one request (its admission, its share of the forward
        pass, committing its blocks, sampling, detokenizing, stop checks) finishes that
        request with an error; the others in the step go on. The step's KV events, if
        collected, then go out as one batch.
        """
        outputs = self._step()
        if self.kv_events is not None:
            self.kv_events_tick()
        return outputs

    def _step(self) -> list[StepOutput]:
        scheduled = self.scheduler.schedule()
        outputs = [self._fail_on_exception(request, exc) for request, exc in self.scheduler.take_failed()]
        work: list[tuple[ScheduledChunk, Chunk]] = []
        for s in scheduled:
            try:
                work.append((s, self._chunk(s)))
            except Exception as exc:
                outputs.append(self._fail_on_exception(s.request, exc))
        if not work:
            return outputs
        masks = self._start_masks(work)
        work, logits = self._execute(work, outputs)
        sampling: list[tuple[_Tracked, int]] = []
        row = 0
        for s, chunk in work:
            request = s.request
            try:
                request.num_computed_tokens = chunk.end
                self.kv.commit_computed(request)
            except Exception as exc:
                outputs.append(self._fail_on_exception(request, exc))
            else:
                if chunk.sample:
                    sampling.append((self._tracked[request.request_id], row))
            row += int(chunk.sample)
        if not sampling:
            return outputs
        rows = [r for _, r in sampling]
        if len(rows) < logits.shape[0]:  # a request failed after the pass: drop its row (a copy; rare)
            logits = logits[rows]
        sampling, logits = self._constrain(logits, sampling, outputs, masks)
        if not sampling:
            return outputs
        if self.logits_observer is not None:
            self.logits_observer([t.request.request_id for t, _ in sampling], logits)
        for (tracked, _), token in zip(sampling, self._sample(logits, [t for t, _ in sampling]), strict=True):
            if isinstance(token, Exception):
                outputs.append(self._fail_on_exception(tracked.request, token))
                continue
            try:
                outputs.append(self._append_token(tracked, token))
            except Exception as exc:
                outputs.append(self._fail_on_exception(tracked.request, exc))
        return outputs

    def _execute(
        self, work: list[tuple[ScheduledChunk, Chunk]], outputs: list[StepOutput]
    ) -> tuple[list[tuple[ScheduledChunk, Chunk]], torch.Tensor]:
        """The forward pass of the step: the work that ran and its logits (one row per sampling chunk).

        If the batched pass raises, each chunk is run again alone, and only those that fail
        alone are failed. Nothing is committed before a pass returns, so a rerun computes
        the same KV into the same slots.
        """
        try:
            return work, self.runner.execute([c for _, c in work])
        except Exception as exc:
            if len(work) == 1:
                outputs.append(self._fail_on_exception(work[0][0].request, exc))
                return [], torch.empty(0, 0)
            log.warning("forward_pass_failed_retrying_one_by_one", requests=len(work), error=repr(exc))
        kept, parts = [], []
        for s, chunk in work:
            try:
                logits = self.runner.execute([chunk])
            except Exception as exc:
                outputs.append(self._fail_on_exception(s.request, exc))
                continue
            kept.append((s, chunk))
            if chunk.sample:
                parts.append(logits)
        return kept, torch.cat(parts) if parts else torch.empty(0, 0)

    def _start_masks(self, work: list[tuple[ScheduledChunk, Chunk]]) -> _Masks | None:
        """Start the grammar masks of the rows that will sample this step, to overlap the forward pass."""
        ids = [
            s.request.request_id
            for s, chunk in work
            if chunk.sample and (tracked := self._tracked.get(s.request.request_id)) is not None and tracked.structured
        ]
        return _Masks(ids, self.structured.start_masks(ids)) if ids else None

    def _constrain(
        self,
        logits: torch.Tensor,
        sampling: list[tuple[_Tracked, int]],
        outputs: list[StepOutput],
        masks: _Masks | None = None,
    ) -> tuple[list[tuple[_Tracked, int]], torch.Tensor]:
        """Mask the logits of the rows whose request has a grammar; no work (the same tensor) when none has.

        Masking fails only on a fault of the grammar library: the rows with a grammar then
        fail and are dropped, the others go on with their logits as they were.
        """
        rows = [i for i, (tracked, _) in enumerate(sampling) if tracked.structured]
        bitmask = masks.take() if masks is not None else None  # joined first: the matchers advance below
        if not rows:
            return sampling, logits
        ids = [sampling[i][0].request.request_id for i in rows]
        try:
            if bitmask is not None and masks is not None:
                position = {rid: i for i, rid in enumerate(masks.ids)}
                bitmask = bitmask[[position[rid] for rid in ids]]  # the rows still sampling, in their order
            return sampling, self.structured.apply(logits, rows, ids, bitmask)
        except Exception as exc:
            outputs.extend(self._fail_on_exception(sampling[i][0].request, exc) for i in rows)
            keep = [i for i in range(len(sampling)) if i not in set(rows)]
            return [sampling[i] for i in keep], logits[keep]

    def _sample(self, logits: torch.Tensor, sampling: list[_Tracked]) -> list[int | Exception]:
        """One token per row; a row whose sampling raises gets its exception instead, the others their tokens."""
        params, generators = [t.request.params for t in sampling], [t.generator for t in sampling]
        try:
            return list(sample(logits, params, generators))
        except Exception:
            pass
        tokens: list[int | Exception] = []
        for i, (p, g) in enumerate(zip(params, generators, strict=True)):
            try:
                tokens.extend(sample(logits[i : i + 1], [p], [g]))
            except Exception as exc:
                tokens.append(exc)
        return tokens

    def _chunk(self, scheduled: ScheduledChunk) -> Chunk:
        request = scheduled.request
        start = request.num_computed_tokens
        end = start + scheduled.num_tokens
        return Chunk(
            token_ids=request.token_slice(start, end),
            start=start,
            slots=self.kv.slot_ids(request, start, end),
            block_ids=[b.block_id for b in request.blocks[: self.kv.blocks_needed(end)]],
            sample=end == request.num_tokens,
            num_prompt_tokens=request.num_prompt_tokens,
        )

    def _append_token(self, tracked: _Tracked, token: int) -> StepOutput:
        request = tracked.request
        request.output_token_ids.append(token)
        if request.first_token_time is None:
            request.first_token_time = time.monotonic()
        detok = tracked.detokenizer
        detok.add(token)
        # The grammar's end ends the request even with ignore_eos: past it only EOS is allowed.
        complete = tracked.structured and self.structured.accept(request.request_id, token)
        reason: FinishReason | None = None
        if token in tracked.eos_token_ids or token in tracked.stop_token_ids or detok.stop_sequence or complete:
            reason = "stop"
        elif len(request.output_token_ids) >= tracked.max_tokens or request.num_tokens >= self.max_model_len:
            reason = "length"
        if reason is not None:
            return self._finish(tracked, reason, new_token=token)
        first = self._usage(request) if len(request.output_token_ids) == 1 else None
        return StepOutput(request.request_id, (token,), detok.take_delta(final=False), prompt_usage=first)

    def _finish(
        self,
        tracked: _Tracked,
        reason: FinishReason,
        *,
        new_token: int | None = None,
        error: str | None = None,
        error_kind: ErrorKind | None = None,
    ) -> StepOutput:
        request = tracked.request
        if request.status is not RequestStatus.FINISHED:
            self.scheduler.finish(request)
        del self._tracked[request.request_id]
        self.structured.release(request.request_id)
        delta = tracked.detokenizer.take_delta(final=True)
        now = time.monotonic()
        output = RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=tuple(request.prompt_token_ids),
            token_ids=tuple(request.output_token_ids),
            text=tracked.detokenizer.text,
            finish_reason=reason,
            usage=self._usage(request),
            stop_sequence=tracked.detokenizer.stop_sequence,
            ttft_s=None if request.first_token_time is None else request.first_token_time - request.arrival_time,
            latency_s=now - request.arrival_time,
            error=error,
            error_kind=error_kind,
        )
        new_tokens = () if new_token is None else (new_token,)
        first = output.usage if len(request.output_token_ids) == 1 and new_token is not None else None
        return StepOutput(request.request_id, new_tokens, delta, finished=output, prompt_usage=first)

    def _fail_on_exception(self, request: Request, exc: Exception) -> StepOutput:
        """A request whose own work raised: logged with its traceback, finished with an internal error."""
        tracked = self._tracked.get(request.request_id)
        if isinstance(exc, InvalidRequestError):  # the request's own fault (a grammar over its limits): a 400
            log.info("request_refused_in_engine", request_id=request.request_id, error=str(exc)[:300])
            if tracked is None:
                return self._lost(request, str(exc), "invalid_request")
            return self._fail(tracked, str(exc), "invalid_request")
        log.error("request_failed_in_engine", request_id=request.request_id, exc_info=exc)
        message = f"the engine failed on this request: {type(exc).__name__}: {exc}"
        if tracked is None:  # already finished by the part that raised
            return self._lost(request, message, "internal")
        return self._fail(tracked, message, "internal")

    def _fail(self, tracked: _Tracked, message: str, kind: ErrorKind) -> StepOutput:
        """Finish a request with an error, whatever state the failure left it in; its blocks are freed."""
        try:
            return self._finish(tracked, "error", error=message, error_kind=kind)
        except Exception:
            log.exception("request_finish_failed", request_id=tracked.request.request_id)
        request = tracked.request
        self._tracked.pop(request.request_id, None)
        self.structured.release(request.request_id)
        if request.status is not RequestStatus.FINISHED:
            try:
                self.scheduler.finish(request)
            except Exception:
                log.exception("request_free_failed", request_id=request.request_id)
        return self._lost(request, message, kind)

    def _lost(self, request: Request, message: str, kind: ErrorKind) -> StepOutput:
        """The error result of a request whose own state could not produce one: the counts it has."""
        prompt = request.num_prompt_tokens
        cached = min(request.num_cached_tokens or 0, prompt)
        by_ttl = dict(request.write_tokens_by_ttl)
        writes = sum(by_ttl.values())
        if cached + writes > prompt:  # the counts that broke an invariant are not reported as written
            by_ttl, writes = {}, 0
        tiers = dict(request.cached_by_tier) if sum(request.cached_by_tier.values()) == cached else {"device": cached}
        usage = Usage(
            prompt_tokens=prompt,
            cached_tokens=cached,
            cache_write_tokens=writes,
            completion_tokens=len(request.output_token_ids),
            cached_tokens_by_tier=tiers,
            cache_write_tokens_by_ttl=by_ttl,
        )
        output = RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=tuple(request.prompt_token_ids),
            token_ids=tuple(request.output_token_ids),
            text="",
            finish_reason="error",
            usage=usage,
            latency_s=time.monotonic() - request.arrival_time,
            error=message,
            error_kind=kind,
        )
        return StepOutput(request.request_id, (), "", finished=output)

    @staticmethod
    def _usage(request: Request) -> Usage:
        cached = request.num_cached_tokens or 0
        writes = sum(request.write_tokens_by_ttl.values())
        assert cached + writes <= request.num_prompt_tokens, "a prompt token counted twice"
        return Usage(
            prompt_tokens=request.num_prompt_tokens,
            cached_tokens=cached,
            cache_write_tokens=writes,
            completion_tokens=len(request.output_token_ids),
            cached_tokens_by_tier=request.cached_by_tier,
            cache_write_tokens_by_ttl=dict(request.write_tokens_by_ttl),
        )

    # -- convenience for tests and benchmarks --------------------------------------------

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec | None = None,
        request_id: str | None = None,
    ) -> RequestOutput:
        """Run one request to completion (other queued requests step along with it)."""
        rid = request_id or f"gen-{time.monotonic_ns()}"
        self.add_request(rid, prompt_token_ids, params, cache or CacheSpec())
        while True:
            for out in self.step():
                if out.request_id == rid and out.finished is not None:
                    return out.finished
