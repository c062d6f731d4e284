"""Block-sized host buffers for blocks on their way to disk, allocated once.

A block leaving the device or the host tier is copied into a staging buffer at
once (its source slot is about to be reused), and the offload worker writes it out
later. acquire() waits when every buffer is in flight: that is the backpressure
that bounds this memory when the disk cannot keep up.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from inference.tiers.layout import BlockLayout


class StagingPool:
    def __init__(self, layout: BlockLayout, count: int, *, pin_memory: bool) -> None:
        assert count > 0
        self.layout = layout
        self._raw = torch.empty((count, layout.nbytes), dtype=torch.uint8, pin_memory=pin_memory)
        self._free = list(range(count))
        self._cond = threading.Condition()
        self.num_waits = 0  # times acquire() had to wait for the worker

    @property
    def count(self) -> int:
        return self._raw.shape[0]

    @property
    def num_free(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        with self._cond:
            if not self._free:
                self.num_waits += 1
            while not self._free:
                self._cond.wait()
            return self._free.pop()

    def release(self, index: int) -> None:
        with self._cond:
            assert index not in self._free
            self._free.append(index)
            self._cond.notify()

    def block(self, index: int) -> torch.Tensor:
        """Buffer index seen as one block of the layout."""
        return self.layout.typed(self._raw[index])

    def raw(self, index: int) -> np.ndarray:
        """Buffer index as uint8 bytes, for file I/O and checksums."""
        return self._raw[index].numpy()
