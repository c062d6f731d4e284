"""torch.compile (Inductor) of the decoder layers, behind KVGATE_COMPILE_LAYERS.

Each decoder layer is compiled on its own ("regional compilation"): the layers share
their code, so Inductor compiles one pair of graphs and every layer reuses them. The
paged attention stays eager (a graph break, `torch._dynamo.disable`): it writes the
pool and calls our C kernel through ctypes. What Inductor gets is everything around it,
RMSNorm, the projections (as oneDNN calls on the packed weights), rotary embeddings,
SiLU·mul and the residual adds, fused into a few C++ loops instead of some forty torch
ops per layer.

Exactness: fused elementwise chains keep float32 between ops where eager rounds to
bf16 after each, so compiled outputs differ from eager ones; what must hold is that a
row never depends on the others, so that cold, warm, extended and batched runs agree.
Every pass goes through the same graph: the batch dimension is dynamic, and the model
runner never runs a single row alone (it pads one to two), so no pass gets a graph
specialised to one row. tests/inference/test_compiled_layers.py checks the exactness
of compiled engines batched and warm.
"""

from __future__ import annotations

import time

import structlog
import torch

log = structlog.get_logger(__name__)


def _linear_as_extern_call() -> None:
    """Make Inductor call oneDNN's packed linear as it is.

    Its own lowering of mkldnn._linear_pointwise serves only weights frozen into the graph
    as constants (Inductor's freezing); regional compilation keeps weights as inputs, shared
    by the layers, so the op is run as an opaque call (a fallback kernel) instead.
    """
    from torch._inductor import lowering
    from torch._inductor import mkldnn_lowerings  # noqa: F401  (registers the lowering replaced here)

    # .binary: Inductor's own fusion of a linear with the residual add that follows it.
    for op in (torch.ops.mkldnn._linear_pointwise.default, torch.ops.mkldnn._linear_pointwise.binary):
        if getattr(lowering.lowerings.get(op), "kvgate_fallback", False):
            continue
        lowering.lowerings.pop(op, None)
        lowering.make_fallback(op, warn=False)
        lowering.lowerings[op].kvgate_fallback = True


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """Compile every decoder layer of a transformers *ForCausalLM in place; returns how many.

    Compilation itself happens lazily, on the first forward pass.
    """
    _linear_as_extern_call()
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return 0
    for layer in layers:
        if not getattr(layer, "kvgate_compiled", False):
            layer.compile(dynamic=True)
            layer.kvgate_compiled = True
    return len(layers)


def timed_warm_up(run: callable) -> float:
    """Run `run` (a forward pass or two that trigger compilation); returns the seconds it took."""
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    log.info("decoder_layers_compiled", seconds=round(seconds, 1))
    return seconds
