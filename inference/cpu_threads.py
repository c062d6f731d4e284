"""How the engine's torch threads wait and how many there are, chosen by measurement (bench/neighbour.py).

Torch runs its CPU kernels on an OpenMP team (libgomp). By default each member spins at
every barrier waiting for the others; when another process takes a core, the member on
it is descheduled for a whole scheduler slice and every parallel region waits for it:
one busy neighbour on a 2-core machine took single-stream decode from 23 to 6 tokens/s.
With OMP_WAIT_POLICY=PASSIVE a waiting member sleeps instead, and gives its core to
whoever needs it (the gateway's own event loop, in `kvgate serve`).

OpenMP reads its environment once, when torch loads it: set_openmp_defaults() must run
before the first `import torch`. The `kvgate` command does it first thing, and so does
the test suite's conftest; an embedding application does it itself (or sets the
variables). A user's own OMP_* / GOMP_* settings always win.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

# Decided by bench/neighbour.py (docs/benchmarks.md, "Noisy neighbours").
OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
# Cores the engine leaves to the rest of its process (the event loop) and to neighbours when
# KVGATE_NUM_THREADS is unset. Measured: with passive waiting, all cores beat all but one.
SPARE_CORES = 0
# Any of these set by the user is their choice of how threads wait: ours is then left out.
_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def set_openmp_defaults(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the OpenMP defaults the environment does not already choose; returns what was set.

    Does nothing once torch is imported (its OpenMP runtime has read the environment already).
    """
    env = os.environ if environ is None else environ
    if "torch" in sys.modules or any(name in env for name in _WAIT_VARIABLES):
        return {}
    env.update(OPENMP_DEFAULTS)
    return dict(OPENMP_DEFAULTS)


def default_num_threads(environ: MutableMapping[str, str] | None = None) -> int | None:
    """The engine's thread count when KVGATE_NUM_THREADS is unset; None keeps torch's own default
    (OMP_NUM_THREADS if the user set it, else every core this process may run on)."""
    env = os.environ if environ is None else environ
    if SPARE_CORES == 0 or "OMP_NUM_THREADS" in env:
        return None
    return max(1, len(os.sched_getaffinity(0)) - SPARE_CORES)
