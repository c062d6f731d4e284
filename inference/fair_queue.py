"""The engine's waiting requests: one first-in first-out queue per tenant (FairShare key).

The scheduler serves the queues by deficit round robin (inference.scheduler); this
holds the requests and the tenants' weights, nothing of the turns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from inference.request import Request


class FairQueue:
    """Waiting requests by tenant key; iteration and len() cover all of them."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Request]] = {}
        self._weights: dict[str, int] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[Request]:
        for queue in list(self._queues.values()):
            yield from list(queue)

    def count(self, key: str) -> int:
        queue = self._queues.get(key)
        return len(queue) if queue is not None else 0

    def append(self, request: Request) -> None:
        self._queue_of(request).append(request)
        self._count += 1

    def appendleft(self, request: Request) -> None:
        """Back at the head of its tenant's queue (a preempted request resumes first)."""
        self._queue_of(request).appendleft(request)
        self._count += 1

    def remove(self, request: Request) -> None:
        key = request.share.key
        self._queues[key].remove(request)
        self._count -= 1
        self._drop_if_empty(key)

    def keys(self) -> list[str]:
        """The tenants with waiting requests, in the order they are visited next."""
        return list(self._queues)

    def head(self, key: str) -> Request:
        return self._queues[key][0]

    def pop(self, key: str) -> Request:
        request = self._queues[key].popleft()
        self._count -= 1
        self._drop_if_empty(key)
        return request

    def weight(self, key: str) -> int:
        return self._weights.get(key, 1)

    def _queue_of(self, request: Request) -> deque[Request]:
        key = request.share.key
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        self._weights[key] = max(1, request.share.weight)  # the newest request's weight is the tenant's
        return queue

    def _drop_if_empty(self, key: str) -> None:
        if not self._queues[key]:
            del self._queues[key]
            self._weights.pop(key, None)
