"""Block copies between the device pool and host buffers, device-generic.

On CPU a copy is a plain memcpy, finished on return. Between a CUDA device and
(pinned) host memory it is queued on the current stream and a CUDA event marks its
end: the model's next forward pass is queued behind it, so the device block it
reads is not overwritten first, and host-side readers wait on the event.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Fence(Protocol):
    def synchronize(self) -> None: ...


def copy_block(dst: torch.Tensor, src: torch.Tensor) -> Fence | None:
    """dst.copy_(src); an event to wait on when the copy may still be running, else None."""
    if dst.device == src.device or "cuda" not in (dst.device.type, src.device.type):
        dst.copy_(src)
        return None
    dst.copy_(src, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return event


def wait(fence: Fence | None) -> None:
    if fence is not None:
        fence.synchronize()
