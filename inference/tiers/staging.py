"""Host buffers for blocks on their way to disk, allocated once, each laid out as a whole disk record.

A block leaving the device or the host tier is copied into a staging buffer at
once (its source slot is about to be reused), and the offload worker writes it out
later. Each buffer is one disk record (header page, payload, padding) and starts on
a page boundary, so the worker fills in the header and writes the record with one
O_DIRECT write, no further copy. acquire() waits when every buffer is in flight:
that is the backpressure that bounds this memory when the disk cannot keep up.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from inference.tiers.disk_format import PAGE
from inference.tiers.layout import BlockLayout


class StagingPool:
    def __init__(
        self, layout: BlockLayout, count: int, *, record_size: int, payload_offset: int, pin_memory: bool
    ) -> None:
        assert count > 0 and record_size % PAGE == 0 and payload_offset + layout.nbytes <= record_size
        self.layout = layout
        self.payload_offset = payload_offset
        # Zeroed once: header padding and payload tail padding stay zero in every record written.
        raw = torch.zeros(count * record_size + PAGE, dtype=torch.uint8, pin_memory=pin_memory)
        skip = -raw.data_ptr() % PAGE
        self._raw = raw[skip : skip + count * record_size].view(count, record_size)
        assert self._raw.data_ptr() % PAGE == 0
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
        """The payload of buffer index, seen as one block of the layout."""
        start = self.payload_offset
        return self.layout.typed(self._raw[index, start : start + self.layout.nbytes])

    def record(self, index: int) -> np.ndarray:
        """Buffer index as the uint8 bytes of a whole record, for the disk tier to fill in and write."""
        return self._raw[index].numpy()
