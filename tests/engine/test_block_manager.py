"""The KV cache's block bookkeeping (engine.core.kv_cache_manager): free
lists, reference counts, and the prefix cache's hash chain and LRU eviction."""
from __future__ import annotations

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.kv_cache_manager import PARTIAL_TOKENS, BlockManager, block_hash
from engine.core.sequence import Sequence
from engine.sampling_params import SamplingParams

BS = 16


def seq(tokens) -> Sequence:
    return Sequence(list(tokens), SamplingParams())


def run(bm: BlockManager, s: Sequence, n: int | None = None) -> list[int]:
    """Admit s as the scheduler does (cached prefix first), compute n of its
    tokens (all: None), and cache the blocks it filled; its hits."""
    computed = bm.computed_blocks(s)
    s.num_computed_tokens = len(computed) * BS
    n = len(s) - s.num_computed_tokens if n is None else n
    assert bm.can_allocate(s, n, computed)
    bm.allocate(s, n, computed)
    s.num_computed_tokens += n
    bm.cache_full_blocks(s)
    return computed


def test_the_blocks_freed_last_are_handed_out_first():
    """A stack, not a queue: a finished sequence's blocks, already touched
    (committed, maybe cached), go to the next sequence instead of fresh memory."""
    bm = BlockManager(num_blocks=64, block_size=BS)
    a = seq(range(40))
    run(bm, a)
    assert a.block_table == [0, 1, 2]
    used = list(a.block_table)
    bm.free_blocks(a)
    b = seq(range(33))
    run(bm, b)
    assert b.block_table == used
    b.token_ids.append(7)
    b.token_ids += [7] * 15  # a fourth block when the 49th token comes
    bm.allocate(b, 16)
    assert b.block_table == used + [3]


def test_the_hash_chains_over_the_whole_prefix():
    one, two = list(range(BS)), list(range(BS, 2 * BS))
    h1 = block_hash(b"", one)
    assert block_hash(h1, two) != block_hash(block_hash(b"", two), two)
    assert block_hash(h1, two) == block_hash(block_hash(b"", list(one)), two)
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    run(bm, seq(one + two + [1]))
    assert len(run(bm, seq(one + two + [5]))) == 2
    assert run(bm, seq(two + two + [5])) == []  # same second block, other parent: no hit
    assert len(run(bm, seq([9] + one[1:] + two + [5]))) == 0


def test_the_last_prompt_token_is_always_computed():
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    tokens = list(range(2 * BS))
    run(bm, seq(tokens))
    assert len(bm.computed_blocks(seq(tokens))) == 1  # the second block holds the last token
    assert len(bm.computed_blocks(seq(tokens + [0]))) == 2


def test_shared_blocks_are_counted_and_outlive_their_first_holder():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    prefix = list(range(2 * BS))
    a, b = seq(prefix + [1, 2]), seq(prefix + [3])
    run(bm, a)
    hits = run(bm, b)
    assert hits == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.ref[x] for x in a.block_table] == [2, 2, 1]
    assert bm.num_free == 8 - 4
    bm.free_blocks(a)
    assert [bm.ref[x] for x in b.block_table] == [1, 1, 1] and bm.num_free == 8 - 3
    bm.free_blocks(b)
    assert bm.num_free == 8 and sum(bm.ref) == 0
    assert len(run(bm, seq(prefix + [4]))) == 2  # freed, still cached


def test_a_block_is_cached_only_once_full_and_written():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    tokens = list(range(3 * BS))
    a = seq(tokens)
    run(bm, a, BS + 5)  # a first chunk: one full block written, the second half-written
    assert len(bm.computed_blocks(seq(tokens))) == 1
    bm.allocate(a, len(a) - a.num_computed_tokens)  # the rest is scheduled, not yet written
    assert len(bm.computed_blocks(seq(tokens))) == 1
    a.num_computed_tokens = len(a)
    bm.cache_full_blocks(a)
    assert len(bm.computed_blocks(seq(tokens + [1]))) == 3


def test_unreferenced_cached_blocks_are_evicted_least_recently_used_and_last():
    bm = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    old, new = list(range(BS)), list(range(100, 100 + BS))
    a = seq(old + [1])
    run(bm, a)
    bm.free_blocks(a)  # block of `old` cached, its uncached tail block free
    b = seq(new + [1])
    run(bm, b)
    bm.free_blocks(b)
    assert len(bm.evictable) == 2
    c = seq(range(200, 200 + BS + 1))  # two blocks: the uncached free ones go first
    run(bm, c)
    assert len(bm.computed_blocks(seq(old + [1]))) == 1
    assert len(bm.computed_blocks(seq(new + [1]))) == 1
    d = seq(range(300, 301))  # one more block: `old`, used least recently, is evicted
    run(bm, d)
    assert bm.computed_blocks(seq(old + [1])) == []
    assert len(bm.computed_blocks(seq(new + [1]))) == 1


# ---- parts of blocks (PARTIAL_TOKENS) -------------------------------------------

PART = PARTIAL_TOKENS
BIG = 4 * PART  # a block of four parts


def test_a_prompt_finds_the_written_parts_of_a_block():
    bm = BlockManager(num_blocks=8, block_size=BIG, enable_prefix_caching=True)
    system = list(range(100, 100 + 2 * PART + 5))
    a = seq(system + [1])
    run(bm, a)  # one block, two parts of it written (and 6 tokens more)
    assert bm.computed_blocks(seq(system + [2])) == []  # no full block
    assert bm.partial_hit(seq(system + [2]), 0) == (a.block_table[0], 2 * PART)
    assert bm.partial_hit(seq(system[:PART + 3] + [2]), 0) == (a.block_table[0], PART)
    assert bm.partial_hit(seq(system[:PART - 1] + [2]), 0) is None  # less than a part
    assert bm.partial_hit(seq(system[:2 * PART]), 0) == (a.block_table[0], PART)  # last token
    assert bm.partial_hit(seq([7] + system[1:] + [2]), 0) is None


def test_parts_chain_on_the_blocks_before_them():
    bm = BlockManager(num_blocks=8, block_size=BIG, enable_prefix_caching=True)
    first, second = list(range(BIG)), list(range(500, 500 + PART + 1))
    a = seq(first + second + [1])
    run(bm, a)
    b = seq(first + second + [2])
    assert len(bm.computed_blocks(b)) == 1
    assert bm.partial_hit(b, 1) == (a.block_table[1], PART)
    other = seq(list(range(1000, 1000 + BIG)) + second + [2])  # same part, another parent
    assert bm.partial_hit(other, 1) is None


def test_a_freed_block_keeps_its_parts_until_it_is_evicted():
    bm = BlockManager(num_blocks=2, block_size=BIG, enable_prefix_caching=True)
    a = seq(list(range(PART + 3)))
    run(bm, a)
    block = a.block_table[0]
    bm.free_blocks(a)
    assert list(bm.evictable) == [block] and bm.num_free == 2
    assert bm.partial_hit(seq(list(range(PART + 3))), 0) == (block, PART)
    run(bm, seq(range(900, 900 + BIG + 1)))  # two blocks: the named one is taken last
    assert bm.partial_hit(seq(list(range(PART + 3))), 0) is None
    assert block_hash(b"", list(range(PART))) not in bm.partial  # its name went with it
    assert all(h in bm.partial_of[b] for h, b in bm.partial.items())


def test_a_copy_source_is_pinned_until_its_step_ran():
    bm = BlockManager(num_blocks=2, block_size=BIG, enable_prefix_caching=True)
    a = seq(list(range(PART + 3)))
    run(bm, a)
    bm.free_blocks(a)
    block, _ = bm.partial_hit(seq(list(range(PART + 3))), 0)
    bm.pin(block)
    assert bm.ref[block] == 1 and bm.num_free == 1 and block not in bm.evictable
    b = seq(range(900, 910))
    run(bm, b)
    assert b.block_table != [block]  # the pinned block is not handed out
    assert not bm.can_allocate(seq(range(2)), 1)
    bm.unpin_all()
    assert bm.ref[block] == 0 and list(bm.evictable) == [block] and bm.num_free == 1


def test_without_prefix_caching_nothing_is_found():
    bm = BlockManager(num_blocks=8, block_size=BS)
    tokens = list(range(3 * BS))
    run(bm, seq(tokens))
    assert bm.computed_blocks(seq(tokens)) == [] and not bm.cached


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 70), st.integers(0, 3)), max_size=50))
def test_no_block_is_held_twice_lost_or_shared_unequal(ops):
    """Random admissions (prompts drawn from 4 prefixes) and frees: every
    block is free xor referenced by exactly its holders, and a block two
    sequences share holds the same tokens in both."""
    bm = BlockManager(num_blocks=24, block_size=8, enable_prefix_caching=True)
    bm.block_size = 8
    live: list[Sequence] = []
    for admit, n, prefix in ops:
        if admit:
            s = seq([prefix] * 20 + list(range(n)))
            computed = bm.computed_blocks(s)
            s.num_computed_tokens = len(computed) * 8
            if bm.can_allocate(s, len(s) - s.num_computed_tokens, computed):
                bm.allocate(s, len(s) - s.num_computed_tokens, computed)
                s.num_computed_tokens = len(s)
                bm.cache_full_blocks(s)
                live.append(s)
        elif live:
            bm.free_blocks(live.pop(n % len(live)))
        held = [b for s in live for b in s.block_table]
        assert sorted(set(held) | set(bm.free) | set(bm.evictable)) == list(range(24))
        assert not set(held) & (set(bm.free) | set(bm.evictable))
        assert all(bm.ref[b] == held.count(b) for b in range(24))
        assert bm.num_free == 24 - len(set(held))
        content = {}
        for s in live:
            for i, b in enumerate(s.block_table[:len(s) // 8]):
                assert content.setdefault(b, s.token_ids[i * 8:(i + 1) * 8]) == \
                    s.token_ids[i * 8:(i + 1) * 8]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 90), st.integers(0, 2)), max_size=50))
def test_every_row_a_sequence_reads_holds_its_token(ops):
    """Random admissions taking whole blocks and parts of blocks (copied, as
    the model runner does), and frees, over a model of each row's content:
    every computed row of every live sequence holds that sequence's token."""
    bs = 2 * PART
    bm = BlockManager(num_blocks=10, block_size=bs, enable_prefix_caching=True)
    rows = [[None] * bs for _ in range(10)]
    live: list[Sequence] = []
    for admit, n, prefix in ops:
        if admit:
            s = seq([prefix] * 20 + list(range(n)))
            computed = bm.computed_blocks(s)
            part = bm.partial_hit(s, len(computed))
            s.num_computed_tokens = len(computed) * bs + (part[1] if part else 0)
            if part:
                bm.pin(part[0])
            new = len(s) - s.num_computed_tokens
            if bm.can_allocate(s, new, computed):
                bm.allocate(s, new, computed)
                if part:
                    dst = s.block_table[len(computed)]
                    rows[dst][:part[1]] = rows[part[0]][:part[1]]
                for p in range(s.num_computed_tokens, len(s)):
                    rows[s.block_table[p // bs]][p % bs] = s.token_ids[p]
                s.num_computed_tokens = len(s)
                bm.cache_full_blocks(s)
                live.append(s)
            bm.unpin_all()
        elif live:
            bm.free_blocks(live.pop(n % len(live)))
        held = [b for s in live for b in s.block_table]
        assert sorted(set(held) | set(bm.free) | set(bm.evictable)) == list(range(10))
        assert all(bm.ref[b] == held.count(b) for b in range(10))
        for s in live:
            assert [rows[s.block_table[p // bs]][p % bs] for p in range(len(s))] == s.token_ids


def test_prefix_cache_counters_reach_the_metrics():
    """The block manager's totals, in the SchedulerStats each step's output
    carries from the core (msgpack), reach the server's counters once."""
    from types import SimpleNamespace

    import msgspec

    from engine.core.engine_core import EngineCore
    from engine.core.messages import SchedulerStats
    from engine.entrypoints.openai.metrics import Metrics

    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    core = SimpleNamespace(blocks=bm, scheduler=SimpleNamespace(running=[], waiting=[],
                                                                num_preemptions=0,
                                                                spec_stats=None))
    m = Metrics("tiny")
    tokens = list(range(2 * BS + 1))
    for _ in range(2):
        s = seq(tokens)
        bm.count_lookup(s, len(run(bm, s)) * BS)
        stats = EngineCore.make_stats(core)  # as the core sends it, step by step
        m.on_stats(msgspec.msgpack.decode(msgspec.msgpack.encode(stats), type=SchedulerStats))
    text = m.render().decode()
    labels = '{engine="0",model_name="tiny"}'
    assert f'vllm:prefix_cache_queries_total{labels} {2.0 * len(tokens)}' in text
    assert f'vllm:prefix_cache_hits_total{labels} {2.0 * BS}' in text
    assert f'vllm:kv_cache_usage_perc{labels} 0.5' in text  # 2 x 3 blocks, 2 shared


def test_the_kv_cache_is_committed_without_changing_what_was_written():
    """cpu_hugepages.populate faults pages in beside steps that write them: the
    bytes already there stay (a zero_() in its place would wipe a prefill)."""
    import torch

    from engine.platforms import cpu_hugepages

    t = cpu_hugepages.empty((8, 1 << 20), torch.float32)  # 32 MiB, never touched
    if not cpu_hugepages.can_populate(t):
        pytest.skip("the kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    t[3, 5] = 42.0
    t[7, -1] = -1.0
    before = _rss()
    cpu_hugepages.populate([t], chunk=2 << 20)
    assert t[3, 5] == 42.0 and t[7, -1] == -1.0
    assert _rss() - before > 24 << 20  # the untouched pages are resident now


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS:"))
