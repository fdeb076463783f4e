"""The KV cache's block bookkeeping (engine.core.kv_cache_manager), on stand-in sequences."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.kv_cache_manager import BlockManager


class Seq:
    def __init__(self, n: int):
        self.n, self.block_table = n, []

    def __len__(self) -> int:
        return self.n


def test_the_blocks_freed_last_are_handed_out_first():
    """A stack, not a queue: a finished sequence's blocks, already touched
    (committed, maybe cached), go to the next sequence instead of fresh memory."""
    bm = BlockManager(num_blocks=64, block_size=16)
    a = Seq(40)
    bm.allocate(a)
    assert a.block_table == [0, 1, 2]
    used = list(a.block_table)
    bm.free_blocks(a)
    b = Seq(33)
    bm.allocate(b)
    assert b.block_table == used
    b.n = 49  # a fourth block when the 49th token comes
    bm.append(b)
    assert b.block_table == used + [3]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 100)), max_size=60))
def test_no_block_is_held_twice_or_lost(ops):
    bm = BlockManager(num_blocks=24, block_size=8)
    live: list[Seq] = []
    for allocate, n in ops:
        if allocate:
            s = Seq(n)
            if bm.can_allocate(s):
                bm.allocate(s)
                live.append(s)
        elif live:
            bm.free_blocks(live.pop(n % len(live)))
        held = [b for s in live for b in s.block_table]
        assert len(held) == len(set(held))
        assert sorted(held + bm.free) == list(range(24))
        assert bm.num_free == 24 - len(held)
