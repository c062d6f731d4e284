"""Constrained decoding: per-request grammar matchers (llguidance) and the token masks they put on the logits.

A request with SamplingParams.structured gets a matcher when it is added. Each step, the
rows of the batch that have one get a bitmask of the tokens their grammar allows next
(EOS only where the grammar accepts), applied to their logits before sampling; each
sampled token then advances the matcher. Rows without a grammar are never touched, and a
step where no row has one does no mask work at all.

Compiled grammars are cached by spec, LRU-bounded; a request's matcher is a copy of the
cached one, released when the request finishes, fails or is aborted.

Nothing here may hold up the engine thread or the event loop for long:
- compiling runs under llguidance's resource limits (inference.grammar.PARSER_LIMITS) and
  includes the first mask, so a grammar too costly to start is a 400 before it is queued;
  AsyncEngine.prepare runs it on a thread of its own (llguidance drops the GIL);
- each step's masks are computed on a thread while the forward pass runs (start_masks),
  so mask work overlaps the model instead of adding to every row's step time;
- a matcher that runs out of its per-step budget mid-generation ends its request with an
  invalid-request error naming the limit, not an internal one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import structlog
import torch

from inference.grammar import PARSER_LIMITS, GrammarLimitError, describe, grammar_for, panics_as
from inference.types import InvalidRequestError, StructuredOutput

log = structlog.get_logger(__name__)

DEFAULT_CACHE_SIZE = 256


class StructuredOutputs:
    """The engine's grammars: compiling (cached), one live matcher per request, masks for a batch."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos_token_ids = list(eos_token_ids)
        self.cache_size = cache_size
        # validate() runs on the caller's thread, open() on the engine's: both use the cache.
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[StructuredOutput, llguidance.LLMatcher] = OrderedDict()
        self._live: dict[str, llguidance.LLMatcher] = {}
        self._words = (vocab_size + 31) // 32
        # One thread: a step's masks are computed there while the engine thread runs the model.
        self._mask_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-grammar-mask")

    # -- compiling -----------------------------------------------------------------------------

    def _tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary, built on first use (about 0.25 s for a 49k vocabulary)."""
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=self._eos_token_ids
                )
            return self._ll_tokenizer

    def compile(self, spec: StructuredOutput) -> llguidance.LLMatcher:
        """The pristine matcher for a spec (cached); InvalidRequestError if llguidance cannot build it."""
        with self._lock:
            matcher = self._compiled.get(spec)
            if matcher is not None:
                self._compiled.move_to_end(spec)
                return matcher
        with panics_as(lambda message: InvalidRequestError(describe(spec, message))):
            grammar = grammar_for(spec)
            matcher = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0, limits=PARSER_LIMITS)
            if not matcher.is_error():
                # The first mask builds the lexer states the grammar starts in: where that is
                # over the limits, this request is refused now rather than failed at its first token.
                first = torch.zeros(self._words, dtype=torch.int32)
                matcher.unsafe_compute_mask_ptr(first.data_ptr(), self._words * 4)
        if matcher.is_error():
            raise GrammarLimitError(describe(spec, matcher.get_error()))
        with self._lock:
            self._compiled[spec] = matcher
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        return matcher

    def warm(self) -> None:
        """Build llguidance's tokenizer now (AsyncEngine.start does, on a compile thread)."""
        self._tokenizer()

    def validate(self, spec: StructuredOutput) -> None:
        self.compile(spec)

    def is_compiled(self, spec: StructuredOutput) -> bool:
        with self._lock:
            return spec in self._compiled

    def close(self) -> None:
        self._mask_thread.shutdown(wait=False)

    @property
    def num_cached(self) -> int:
        return len(self._compiled)

    # -- per-request matchers ------------------------------------------------------------------

    def open(self, request_id: str, spec: StructuredOutput) -> None:
        """Give a request its own matcher, at the grammar's start."""
        matcher = self.compile(spec)
        with panics_as(RuntimeError):
            self._live[request_id] = matcher.deep_copy()

    def release(self, request_id: str) -> None:
        self._live.pop(request_id, None)

    def has(self, request_id: str) -> bool:
        return request_id in self._live

    @property
    def num_live(self) -> int:
        return len(self._live)

    def accept(self, request_id: str, token: int) -> bool:
        """Advance a request's matcher by its sampled token; True once the grammar is complete.

        Complete means EOS was taken where the grammar accepts, or nothing but EOS may follow.
        A token outside the mask cannot be sampled, so a rejection is a bug and raises.
        """
        matcher = self._live[request_id]
        if matcher.is_error():  # its mask ran out of llguidance's per-step budget: EOS was all it allowed
            raise GrammarLimitError(f"the grammar went over its limits while generating: {matcher.get_error()[:200]}")
        with panics_as(RuntimeError):
            accepted, stopped = matcher.consume_token(token), matcher.is_stopped()
        if not accepted and _over_limits(matcher.get_error()):  # the token's parse ran out of its budget
            raise GrammarLimitError(f"the grammar went over its limits while generating: {matcher.get_error()[:200]}")
        if not accepted:
            raise RuntimeError(f"the grammar matcher rejected token {token}: {matcher.get_error()}")
        return stopped

    # -- masks -----------------------------------------------------------------------------------

    def bitmask(self, request_ids: Sequence[str]) -> torch.Tensor:
        """[n, ceil(vocab/32)] int32: bit t of row i is set when request i may sample token t next."""
        out = torch.zeros((len(request_ids), self._words), dtype=torch.int32)
        with panics_as(RuntimeError):  # a panic fails the step's grammar rows, not the engine thread
            for i, request_id in enumerate(request_ids):
                # Drops the GIL; an errored matcher yields a mask of EOS alone.
                self._live[request_id].unsafe_compute_mask_ptr(out[i].data_ptr(), self._words * 4)
        return out

    def start_masks(self, request_ids: Sequence[str]) -> Future[torch.Tensor]:
        """bitmask(request_ids), computed on the mask thread; the matchers must not advance until it is done."""
        return self._mask_thread.submit(self.bitmask, list(request_ids))

    def apply(
        self, logits: torch.Tensor, rows: Sequence[int], request_ids: Sequence[str], bitmask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The logits with the tokens request_ids[i] may not sample next set to -inf in row rows[i].

        bitmask: their masks, if already computed (start_masks). A new tensor (the model's
        logits are inference tensors, not to be written in place); the other rows are
        copied unchanged. rows ascend.
        """
        if bitmask is None:
            bitmask = self.bitmask(request_ids)
        allowed = unpack_bitmask(bitmask, logits.shape[-1]).to(logits.device)
        neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
        if len(rows) == logits.shape[0]:  # every row has a grammar (rows are then 0..n-1)
            return torch.where(allowed, logits, neg_inf)
        out = logits.clone()
        index = torch.tensor(list(rows), device=logits.device)
        out[index] = torch.where(allowed, logits[index], neg_inf)
        return out


def _over_limits(error: str) -> bool:
    """An llguidance error of a resource limit (Earley items, lexer fuel or states), not of a wrong token."""
    lowered = error.lower()
    return any(word in lowered for word in ("too many", "limit", "fuel"))


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool [n, vocab_size] from an int32 bitmask (little-endian bits: token t is bit t % 32 of word t // 32)."""
    words = bitmask.numpy().view(np.uint8)
    bits = np.unpackbits(words, axis=1, count=vocab_size, bitorder="little")
    return torch.from_numpy(bits.view(np.bool_))
