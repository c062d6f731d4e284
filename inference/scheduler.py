"""Continuous batching: which requests run in the next step, and how many tokens each computes."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from inference.kv_cache_manager import KVCacheManager
from inference.request import Request, RequestStatus


@dataclass(frozen=True)
class ScheduledChunk:
    request: Request
    num_tokens: int  # computed from request.num_computed_tokens


class Scheduler:
    """A FIFO waiting queue and a running list, stepped under a token budget.

    Each step first gives every running request its next chunk (one token for a
    decode), then admits waiting requests into what is left of the budget. When the
    pool runs out, the most recently admitted request is preempted: its blocks are
    freed (its committed blocks stay cached) and it is recomputed later.
    """

    def __init__(self, *, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
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
        budget = self.max_num_batched_tokens
        out: list[ScheduledChunk] = []
        preempted = False
        scheduled: set[int] = set()
        # Decodes first, so a long prefill chunk never starves them of budget.
        for request in sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1):
            if request.status is not RequestStatus.RUNNING or budget <= 0:
                continue
            n = self.chunk_len(request, request.num_computed_tokens, budget)
            while not self.kv.allocate_slots(request, n):
                victim = next(r for r in reversed(self.running) if id(r) not in scheduled)
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            else:
                out.append(ScheduledChunk(request, n))
                scheduled.add(id(request))
                budget -= n
        # Admitting new work right after a preemption would just thrash the pool.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            request = self.waiting[0]
            try:
                hits = self.kv.find_hits(request)
                if out and not self.kv.prefetch(hits):
                    # Its prefix is still coming from a remote tier: this step runs the others
                    # while it arrives, and the request is admitted at a later step.
                    break
                n = self.chunk_len(request, len(hits) * self.kv.block_size, budget)
                admitted = self.kv.admit(request, hits, n)
            except Exception as exc:
                # One request's lookup or promotion raised (admit undoes its own reservations):
                # it alone fails, and the queue behind it moves on.
                self.waiting.popleft()
                request.status = RequestStatus.FINISHED
                self._failed.append((request, exc))
                continue
            if not admitted:
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.append(ScheduledChunk(request, n))
            budget -= n
        return out

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.num_committed_blocks = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
