import subprocess
import sys

from inference.hashing import BlockHasher


def hasher(algo: str = "sha256", model_id: str = "m") -> BlockHasher:
    return BlockHasher(model_id=model_id, block_size=4, algo=algo)  # type: ignore[arg-type]


def test_only_full_blocks_are_hashed_and_chained():
    h = hasher()
    tokens = list(range(10))
    hashes = h.hash_blocks(tokens, None)
    assert len(hashes) == 2
    assert hashes[0] == h.hash_block(None, tokens[:4], None)
    assert hashes[1] == h.hash_block(hashes[0], tokens[4:8], None)
    # Resuming the chain from a block index gives the same tail.
    assert h.hash_blocks(tokens, None, start=1, parent=hashes[0]) == hashes[1:]


def test_salt_reaches_every_block_through_the_chain():
    h = hasher()
    tokens = list(range(12))
    plain, a, a_again, b = (h.hash_blocks(tokens, s) for s in (None, "a", "a", "b"))
    assert a == a_again
    for i in range(3):
        assert len({plain[i], a[i], b[i]}) == 3
    # An empty salt is a salt, not the absence of one.
    assert h.hash_blocks(tokens, "")[0] != plain[0]


def test_model_id_and_token_order_matter():
    tokens = list(range(8))
    assert hasher(model_id="m1").hash_blocks(tokens, None) != hasher(model_id="m2").hash_blocks(tokens, None)
    assert hasher().hash_blocks(tokens, None) != hasher().hash_blocks(tokens[::-1], None)


def test_hashes_are_the_same_in_another_process():
    code = (
        "from inference.hashing import BlockHasher;"
        "print(BlockHasher(model_id='m', block_size=4, algo='{algo}').hash_blocks(list(range(8)), 's')[1].hex())"
    )
    for algo in ("sha256", "xxhash128"):
        here = hasher(algo).hash_blocks(list(range(8)), "s")[1].hex()
        there = subprocess.run(
            [sys.executable, "-c", code.format(algo=algo)], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert here == there
        assert len(bytes.fromhex(here)) == (32 if algo == "sha256" else 16)
