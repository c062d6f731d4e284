"""Continuous batching: which requests run in the next step, and how many tokens each computes.

Fair share across tenants (FairShare keys), where one tenant's flood would otherwise
stall everyone else:
- Waiting requests queue per tenant (inference.fair_queue), FIFO within a tenant.
- The step's prefill budget (its running prefills and its admissions) goes by deficit
  round robin: each turn grants a tenant `fair_prefill_quantum * weight` tokens of
  credit, and no chunk exceeds its tenant's credit while another tenant has prefill work.
  With one tenant at work, nothing changes: its requests take the whole budget in order.
- A step in which more than one tenant has work (prefills or decodes) computes at most
  `contended_prefill_tokens` prompt tokens, so a neighbour's long prompts add a small chunk
  to another tenant's step, not a 2,048-token one. A tenant alone keeps the whole budget.
- A tenant with nothing running whose head request cannot be admitted (no free slot or
  blocks) preempts the newest request of the tenant running the most (fair_preempt),
  once a step; the preempted request keeps its committed blocks and resumes first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inference.fair_queue import FairQueue
from inference.kv_cache_manager import KVCacheManager
from inference.request import Request, RequestStatus


@dataclass(frozen=True)
class ScheduledChunk:
    request: Request
    num_tokens: int  # computed from request.num_computed_tokens


@dataclass
class _Step:
    """What one schedule() call has decided so far."""

    budget: int
    out: list[ScheduledChunk] = field(default_factory=list)
    scheduled: set[int] = field(default_factory=set)  # ids of the requests given a chunk
    preempted: bool = False


class Scheduler:
    """A FIFO waiting queue and a running list, stepped under a token budget.

    Each step first gives every running request its next chunk (one token for a
    decode), then admits waiting requests into what is left of the budget. When the
    pool runs out, the most recently admitted request is preempted: its blocks are
    freed (its committed blocks stay cached) and it is recomputed later.
    """

    def __init__(
        self,
        *,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        fair_prefill_quantum: int = 256,
        contended_prefill_tokens: int | None = None,
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.fair_prefill_quantum = fair_prefill_quantum
        self.contended_prefill_tokens = contended_prefill_tokens
        self.waiting = FairQueue()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_fair_preemptions = 0
        # Deficit round robin: each tenant's credit in prompt tokens, and the order of turns.
        self._credit: dict[str, int] = {}
        self._turns: dict[str, None] = {}
        # Requests whose admission raised, taken out of the queue for the engine to fail alone.
        self._failed: list[tuple[Request, Exception]] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def finish(self, request: Request) -> None:
        """Remove a request wherever it is and free its blocks."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        self.kv.free(request)

    def take_failed(self) -> list[tuple[Request, Exception]]:
        """The requests whose admission raised since the last call (they hold no blocks), and why."""
        failed, self._failed = self._failed, []
        return failed

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def chunk_len(self, request: Request, start: int, budget: int) -> int:
        """Tokens to compute from `start`: a prefill pass stops at the next split point.

        Computing what lies past a cacheable point in passes of their own makes a cold
        run do exactly what a warm run will: one that hits up to that point repeats
        the same passes on the same cached KV, so its logits are bit-identical.
        """
        target = request.num_tokens
        for point in request.split_points:
            if start < point:
                target = point
                break
        return min(target - start, budget)

    def schedule(self) -> list[ScheduledChunk]:
        step = _Step(budget=self.max_num_batched_tokens)
        prefilling: dict[str, deque[Request]] = {}
        decodes: list[Request] = []
        for request in self.running:
            if request.num_tokens - request.num_computed_tokens > 1:
                prefilling.setdefault(request.share.key, deque()).append(request)
            else:
                decodes.append(request)
        # Decodes first, so a long prefill chunk never starves them of budget.
        for request in decodes:
            if request.status is RequestStatus.RUNNING and step.budget > 0:
                self._run_chunk(step, request)
        keys = list(dict.fromkeys([*prefilling, *self.waiting.keys()]))
        decoding = {r.share.key for r in decodes if id(r) in step.scheduled}
        if keys and len(decoding | set(keys)) > 1 and self.contended_prefill_tokens is not None:
            # More than one tenant has work in this step: one's prefill must not make it long for another.
            step.budget = min(step.budget, self.contended_prefill_tokens)
        for key in list(self._turns):
            if key not in keys:  # no prefill work left: a tenant's credit is not saved up
                self._credit.pop(key, None)
                del self._turns[key]
        for key in keys:
            self._turns.setdefault(key, None)
        contended = len(keys) > 1
        active = [k for k in self._turns if k in keys]
        while step.budget > 0 and active:
            for key in list(active):
                if step.budget <= 0:
                    break
                if contended:
                    self._credit[key] = min(
                        self._credit.get(key, 0) + self.fair_prefill_quantum * self._weight(key, prefilling),
                        self.max_num_batched_tokens,
                    )
                if not self._serve(step, key, prefilling.get(key), contended):
                    active.remove(key)
                self._turns.pop(key, None)  # its turn is over: to the back
                self._turns[key] = None
        return step.out

    def _weight(self, key: str, prefilling: dict[str, deque[Request]]) -> int:
        if self.waiting.count(key):
            return self.waiting.weight(key)
        running = prefilling.get(key)
        return max(1, running[0].share.weight) if running else 1

    def _serve(self, step: _Step, key: str, prefilling: deque[Request] | None, contended: bool) -> bool:
        """Give one tenant's prefill work chunks while it has credit (all of the budget if uncontended).

        Its running prefills first, then its waiting requests in order. False once the
        tenant has nothing more to do this step (no work left, or its head cannot be admitted).
        """
        while step.budget > 0:
            limit = min(step.budget, self._credit.get(key, 0)) if contended else step.budget
            if limit <= 0:
                return True
            if prefilling:
                request = prefilling.popleft()
                if request.status is RequestStatus.RUNNING and id(request) not in step.scheduled:
                    n = self._run_chunk(step, request, limit)
                    if contended:
                        self._credit[key] -= n
                continue
            if not self.waiting.count(key):
                return False
            n = self._admit(step, key, limit)
            if n is None:
                return False
            if contended:
                self._credit[key] -= n
        return True

    def _run_chunk(self, step: _Step, request: Request, limit: int | None = None) -> int:
        """Schedule a running request's next chunk (at most `limit` tokens), preempting on a full pool; tokens given."""
        n = self.chunk_len(request, request.num_computed_tokens, step.budget if limit is None else limit)
        while not self.kv.allocate_slots(request, n):
            victim = next(r for r in reversed(self.running) if id(r) not in step.scheduled)
            self._preempt(victim)
            step.preempted = True
            if victim is request:
                return 0
        step.out.append(ScheduledChunk(request, n))
        step.scheduled.add(id(request))
        step.budget -= n
        return n

    def _admit(self, step: _Step, key: str, limit: int, *, retry: bool = True) -> int | None:
        """Admit the head of a tenant's queue with its first chunk; the tokens given, or None if it must wait."""
        # Admitting new work right after a preemption would just thrash the pool.
        if step.preempted:
            return None
        if len(self.running) >= self.max_num_seqs:
            if retry and self._fair_preempt(step, key):
                return self._admit(step, key, limit, retry=False)
            return None
        request = self.waiting.head(key)
        try:
            hits = self.kv.find_hits(request)
            if step.out and not self.kv.prefetch(hits):
                # Its prefix is still coming from a remote tier: this step runs the others
                # while it arrives, and the request is admitted at a later step.
                return None
            n = self.chunk_len(request, len(hits) * self.kv.block_size, limit)
            admitted = self.kv.admit(request, hits, n)
        except Exception as exc:
            # One request's lookup or promotion raised (admit undoes its own reservations):
            # it alone fails, and the queue behind it moves on.
            self.waiting.pop(key)
            request.status = RequestStatus.FINISHED
            self._failed.append((request, exc))
            return 0
        if not admitted:
            if retry and self._fair_preempt(step, key):
                return self._admit(step, key, limit, retry=False)
            return None
        self.waiting.pop(key)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        step.out.append(ScheduledChunk(request, n))
        step.scheduled.add(id(request))
        step.budget -= n
        return n

    def _fair_preempt(self, step: _Step, key: str) -> bool:
        """A tenant with nothing running is refused a slot or blocks: the tenant running the most gives one
        back (its newest request). True if one did; the tenant's head is then tried again at once."""
        counts: dict[str, int] = {}
        for request in self.running:
            counts[request.share.key] = counts.get(request.share.key, 0) + 1
        if counts.get(key, 0) > 0 or not counts:
            return False
        hog = max(counts, key=lambda k: counts[k])
        if hog == key or counts[hog] < 2:  # one request each is as fair as it gets
            return False
        victim = next(r for r in reversed(self.running) if r.share.key == hog)
        if id(victim) in step.scheduled:  # its chunk (a decode, usually) comes out of this step
            chunk = next(c for c in step.out if c.request is victim)
            step.out.remove(chunk)
            step.scheduled.discard(id(victim))
            step.budget += chunk.num_tokens
        self._preempt(victim)
        self.num_fair_preemptions += 1
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.num_committed_blocks = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
