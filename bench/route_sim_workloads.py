"""Workloads for the routing simulator (bench/route_sim.py): tenants, system prompts, sessions, bursts.

Every request carries the real salted chained block hashes a gateway would route on
(inference.hashing.BlockHasher, one cache salt per tenant), so two tenants' identical
text never shares a block, exactly as in kvgate. Token ids are random and never kept:
a session's hashes are computed once, incrementally (turn k+1 extends turn k), and each
request is a prefix of its session's chain. Everything is drawn from one seeded
random.Random, so a workload is the same on every run.

Arrivals are open-loop: turn k+1 arrives a think time after turn k arrived plus the
time to read the reply, whatever the policy did, so every policy sees the same requests
at the same instants.

Load: a workload's sessions (their number and contents) depend only on the seed; the
window in which they start is then stretched or squeezed so that the offered load is
`offered_load`: the prefill work of every prompt computed from scratch (no cache at all,
at the calibrated cost) / (engines × the window). Above 1, a cluster without prefix
caching could not keep up; with it, hits decide the latency. Think times stay as drawn.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from inference.hashing import BlockHash, BlockHasher

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
BLOCK_SIZE = 16
MAX_CONTEXT = 8192  # SmolLM2's: a session ends before its prompt would pass it


@dataclass(frozen=True, slots=True)
class SimRequest:
    arrival: float  # seconds from the start
    tenant: int
    session: int
    turn: int
    prompt_tokens: int
    output_tokens: int
    chain: Sequence[BlockHash]  # the session's hash chain; this request's blocks are chain[:num_blocks]
    num_blocks: int  # full blocks of the prompt (prompt_tokens // BLOCK_SIZE)

    @property
    def block_hashes(self) -> Sequence[BlockHash]:
        return self.chain[: self.num_blocks]


@dataclass(frozen=True)
class WorkloadSpec:
    """The knobs of a workload. Rates are per engine, so a workload scales with the cluster."""

    name: str
    tenants: int = 48
    zipf_s: float = 1.1  # tenant popularity: weight of rank k is 1/k^s
    system_min: int = 256
    system_max: int = 2048
    duration_s: float = 600.0  # sessions start in [0, duration) before the load stretches it
    sessions_per_s_per_engine: float = 0.2
    offered_load: float = 1.2  # cold prefill work / (engines × start window)
    mean_turns: float = 5.0  # 1 for single-turn requests
    max_turns: int = 16
    user_min: int = 16
    user_max: int = 400
    reply_min: int = 32
    reply_max: int = 400
    think_mean_s: float = 20.0
    read_tokens_per_s: float = 40.0  # the reply streams at roughly the engine's decode speed
    # Bursts: every burst_every_s, one tenant (drawn by popularity) opens burst_sessions sessions within 2 s.
    burst_every_s: float = 0.0
    burst_sessions: int = 0


WORKLOADS = {
    "multiturn": WorkloadSpec("multiturn"),
    "sysprompt": WorkloadSpec(
        "sysprompt",
        mean_turns=1.0,
        sessions_per_s_per_engine=0.5,
        system_min=512,
        system_max=3072,
        offered_load=1.2,
    ),
    "bursts": WorkloadSpec(
        "bursts",
        sessions_per_s_per_engine=0.1,
        burst_every_s=30.0,
        burst_sessions=48,
        mean_turns=3.0,
        offered_load=1.2,
    ),
}


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


class _Tenant:
    def __init__(self, index: int, rng: random.Random, spec: WorkloadSpec, hasher: BlockHasher) -> None:
        self.salt = f"tenant-{index}"
        self.system = [rng.randrange(100, 49000) for _ in range(_log_uniform(rng, spec.system_min, spec.system_max))]
        full = len(self.system) // BLOCK_SIZE
        self.system_chain = hasher.hash_blocks(self.system[: full * BLOCK_SIZE], self.salt)


def _session(
    rng: random.Random,
    spec: WorkloadSpec,
    hasher: BlockHasher,
    tenant_index: int,
    tenant: _Tenant,
    session: int,
    start: float,
) -> list[SimRequest]:
    """The turns of one chat: each prompt is the previous prompt + its reply + a new user message."""
    turns = 1 if spec.mean_turns <= 1 else min(spec.max_turns, 1 + int(rng.expovariate(1 / (spec.mean_turns - 1))))
    tokens = list(tenant.system)
    chain = list(tenant.system_chain)  # the system prompt's blocks are shared by the tenant's sessions
    out: list[SimRequest] = []
    at = start
    for turn in range(turns):
        tokens += [rng.randrange(100, 49000) for _ in range(_log_uniform(rng, spec.user_min, spec.user_max))]
        reply = _log_uniform(rng, spec.reply_min, spec.reply_max)
        if len(tokens) + reply > MAX_CONTEXT:
            break
        full = len(tokens) // BLOCK_SIZE
        if full > len(chain):
            parent = chain[-1] if chain else None
            chain += hasher.hash_blocks(tokens[: full * BLOCK_SIZE], tenant.salt, start=len(chain), parent=parent)
        out.append(SimRequest(at, tenant_index, session, turn, len(tokens), reply, chain, full))
        tokens += [rng.randrange(100, 49000) for _ in range(reply)]
        at += reply / spec.read_tokens_per_s + rng.expovariate(1 / spec.think_mean_s)
    return out


def generate(
    spec: WorkloadSpec, engines: int, seed: int, cold_prefill_s: Callable[[int], float] | None = None
) -> list[SimRequest]:
    """All requests of a workload for a cluster of `engines`, sorted by arrival.

    With cold_prefill_s (seconds to prefill n tokens from scratch), session starts are rescaled to
    spec.offered_load; without it they stay at spec.sessions_per_s_per_engine."""
    rng = random.Random(f"{spec.name}/{engines}/{seed}")
    hasher = BlockHasher(model_id=MODEL_ID, block_size=BLOCK_SIZE)
    tenants = [_Tenant(i, rng, spec, hasher) for i in range(spec.tenants)]
    weights = [1 / (k + 1) ** spec.zipf_s for k in range(spec.tenants)]
    requests: list[SimRequest] = []
    starts: list[tuple[float, int]] = []
    rate = spec.sessions_per_s_per_engine * engines
    at = rng.expovariate(rate)
    while at < spec.duration_s:
        starts.append((at, rng.choices(range(spec.tenants), weights)[0]))
        at += rng.expovariate(rate)
    if spec.burst_every_s > 0:
        burst = spec.burst_every_s / 2
        while burst < spec.duration_s:
            tenant = rng.choices(range(spec.tenants), weights)[0]
            starts += [(burst + rng.uniform(0, 2.0), tenant) for _ in range(spec.burst_sessions)]
            burst += spec.burst_every_s
    starts.sort()
    for session, (start, tenant) in enumerate(starts):
        requests += _session(rng, spec, hasher, tenant, tenants[tenant], session, start)
    if cold_prefill_s is not None and spec.offered_load > 0 and requests:
        work = sum(cold_prefill_s(r.prompt_tokens) for r in requests)
        stretch = work / (engines * spec.offered_load) / spec.duration_s
        begun = {r.session: r.arrival for r in requests if r.turn == 0}
        requests = [replace(r, arrival=r.arrival + begun[r.session] * (stretch - 1)) for r in requests]
    requests.sort(key=lambda r: (r.arrival, r.session))
    return requests


def scaled(spec: WorkloadSpec, factor: float) -> WorkloadSpec:
    """The same workload over a shorter (factor < 1) or longer window: for quick runs and tests."""
    return replace(spec, duration_s=spec.duration_s * factor)
