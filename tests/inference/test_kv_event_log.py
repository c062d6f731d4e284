"""KVEventLog on its own: batching, coalescing, seq, the expiry sweep and the snapshot (no engine, no NATS)."""

from __future__ import annotations

from inference.kv_event_log import KVEventLog, tier_medium
from kvgate.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from tests.inference.kv_event_helpers import replay, snapshot_state

A, B, C, D = (bytes([i]) * 32 for i in range(1, 5))


def make_log() -> tuple[KVEventLog, list[KVEventBatch]]:
    sent: list[KVEventBatch] = []
    return KVEventLog(engine_id="e1", block_size=16, sink=sent.append), sent


def test_a_chain_stored_in_one_step_is_one_event_and_batches_count_up_from_1():
    log, sent = make_log()
    log.stored("CPU", A, None, 300, 1300.0)
    log.stored("CPU", B, A, 300, 1300.0)
    log.stored("CPU", C, B, 300, 1300.0)
    log.stored("HOST", D, None, 300, 1200.0)
    batch = log.flush()
    assert batch is not None and batch.seq == 1 and sent == [batch] and batch.engine_id == "e1"
    cleared, chain, host = batch.events
    assert isinstance(cleared, AllBlocksCleared)
    assert chain == BlockStored([A, B, C], None, [], 16, medium="CPU", ttl_s=300, expires_at=1300.0)
    assert host.block_hashes == [D] and host.medium == "HOST"
    assert log.flush() is None and len(sent) == 1  # nothing pending: no batch, no seq consumed
    log.removed("CPU", B)
    log.removed("CPU", C)
    log.removed("CPU", C)  # reported twice (an expired block dropped late): said once
    log.removed("DISK", A)  # never stored there: nothing to say
    (removed,) = log.flush().events  # type: ignore[union-attr]
    assert removed == BlockRemoved([B, C], medium="CPU") and sent[-1].seq == 2
    assert replay(sent) == {("CPU", A): 1300.0, ("HOST", D): 1200.0}


def test_storing_again_says_something_only_when_the_expiry_or_ttl_grows():
    log, _ = make_log()
    log.stored("HOST", A, None, 300, 1300.0)
    log.flush()
    log.stored("HOST", A, None, 300, 1300.0)
    log.stored("HOST", A, None, 300, 1250.0)
    assert log.flush() is None
    log.stored("HOST", A, None, 300, 1400.0)
    (refresh,) = log.flush().events  # type: ignore[union-attr]
    assert refresh.block_hashes == [A] and refresh.expires_at == 1400.0


def test_the_sweep_removes_what_expired_and_refreshes_what_lives_on_just_before_its_expiry():
    log, sent = make_log()
    truth = {A: 1300.0, B: 1300.0, C: 1300.0}  # what the medium says now
    probes = {"CPU": lambda h, now: truth.get(h)}
    for h in (A, B, C):
        log.stored("CPU", h, None, 300, 1300.0)
    log.flush()
    truth[B] = 1600.0  # used again: lives on
    del truth[C]  # gone without a word (a missed report): the sweep heals it
    log.sweep(1297.0, probes)  # before the refresh margin (2 s): nothing
    assert log.flush() is None
    log.sweep(1298.5, probes)
    events = log.flush().events  # type: ignore[union-attr]
    assert [(type(e).__name__, e.block_hashes) for e in events] == [("BlockStored", [B]), ("BlockRemoved", [C])]
    assert events[0].expires_at == 1600.0
    log.sweep(1299.9, probes)  # A is not extended and not expired yet
    assert log.flush() is None
    log.sweep(1300.0, probes)
    assert log.flush().events == [BlockRemoved([A], medium="CPU")]  # type: ignore[union-attr]
    assert replay(sent) == {("CPU", B): 1600.0}


def test_a_report_made_while_the_sweep_probes_wins_over_the_sweep():
    log, sent = make_log()

    def probe(block_hash: bytes, now: float) -> float | None:
        log.stored("DISK", block_hash, None, 300, 2000.0)  # the disk writer refreshes it meanwhile
        return None

    log.stored("DISK", A, None, 300, 1300.0)
    log.sweep(1300.0, {"DISK": probe})
    log.flush()
    assert replay(sent) == {("DISK", A): 2000.0}


def test_the_snapshot_is_the_replay_of_the_batches_up_to_its_seq():
    log, sent = make_log()
    log.stored("CPU", A, None, 300, 1300.0)
    log.flush()
    log.stored("CPU", B, A, 300, 1300.0)
    log.stored("HOST", C, None, 60, 1100.0)
    log.removed("CPU", A)
    snapshot = log.snapshot()  # flushes what is pending first
    assert snapshot.seq == 2 == sent[-1].seq and snapshot.engine_id == "e1"
    assert snapshot_state(snapshot) == replay(sent) == {("CPU", B): 1300.0, ("HOST", C): 1100.0}
    log.cleared()
    assert snapshot_state(log.snapshot()) == replay(sent) == {}


def test_tiers_map_to_vllms_media():
    assert [tier_medium(n) for n in ("host", "disk", "redis", "nvme")] == ["HOST", "DISK", "REMOTE", "NVME"]


def test_a_step_that_moves_many_blocks_goes_out_as_several_batches_that_replay_the_same():
    sent: list[KVEventBatch] = []
    log = KVEventLog(engine_id="e1", block_size=16, sink=sent.append, max_hashes_per_batch=4)
    chain = [bytes([i]) * 32 for i in range(10, 20)]
    parent = None
    for h in chain:
        log.stored("CPU", h, parent, 300, 1300.0)
        parent = h
    log.stored("HOST", A, None, 300, 1300.0)
    for h in chain[:6]:
        log.removed("CPU", h)
    last = log.flush()
    assert last is sent[-1] and [b.seq for b in sent] == [1, 2, 3, 4, 5]
    assert all(sum(len(getattr(e, "block_hashes", ())) for e in b.events) <= 4 for b in sent)
    stored = [e for b in sent for e in b.events if isinstance(e, BlockStored) and e.medium == "CPU"]
    assert [h for e in stored for h in e.block_hashes] == chain
    assert [e.parent_block_hash for e in stored] == [None, chain[3], chain[7]]  # each piece still chains
    assert replay(sent) == {("CPU", h): 1300.0 for h in chain[6:]} | {("HOST", A): 1300.0}
