"""The paged KV cache's bookkeeping: which blocks are free, which each
sequence holds, and (with prefix caching) which full blocks hold which tokens.

A block is shared by reference count. With prefix caching, a block becomes
cached once it is full and its K/V are written (after the step that wrote
it): it is named by a hash chained over the token ids of every block up to
it (upstream V1's scheme), so a block is found only by a sequence whose
whole prefix up to it is the same tokens, and never while it is written.
A freed cached block keeps its content in an LRU list until it is needed
for other data; a block that holds nothing reusable (uncached, or never
used) is handed out first.

A prompt that shares only part of a block (a system prompt ends mid-block,
the rest of that block is each user's own) takes the shared part too: once
written, each PARTIAL_TOKENS-long prefix of a block's tokens (16, 32, ...) is
named as well, in full blocks and in the block a sequence is still filling,
and a sequence whose next tokens match such a part gets a fresh block into
which the model runner copies those K/V rows (StepInputs.kv_copies) before
it computes the rest; a freed block with such a name stays in the LRU list.
Without it a 128-token block recomputes up to 127 shared tokens a prompt (a
1501-token system prompt: 93 of its tokens recomputed instead of 13); upstream
matches whole blocks only. The copy's source is pinned until its step has run.

Those uncached free blocks are a stack: the block freed last is handed out
first. The cache is committed lazily (its pages are touched as blocks fill),
so reusing warm blocks keeps the resident memory at the working set instead
of growing to the whole cache as a queue would cycle through it."""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from engine.core.sequence import Sequence

_ROOT = b""  # the parent hash of a sequence's first block
# The granularity of partial-block hits: a part this long costs one hash per
# cached block and part, and saves recomputing up to this many tokens less one.
PARTIAL_TOKENS = 16


def block_hash(parent: bytes, token_ids) -> bytes:
    """sha256 over the parent's hash and the block's token ids: a collision
    (a block reused whose content differs) is out of reach, unlike Python's
    64-bit hash."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def root_hash(seq: Sequence) -> bytes:
    """The parent hash of a sequence's first block: an adapter's own
    (engine/lora), its K/V differ from the base model's for the same tokens."""
    lora = seq.lora_request
    return _ROOT if lora is None else f"lora:{lora.lora_int_id}".encode()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))  # block 0 on top
        self.evictable: OrderedDict[int, None] = OrderedDict()  # named, unreferenced: LRU first
        self.ref = [0] * num_blocks
        self.hash_of: dict[int, bytes] = {}
        self.cached: dict[bytes, int] = {}
        self.partial: dict[bytes, int] = {}  # a block's first k * PARTIAL_TOKENS tokens
        self.partial_of: dict[int, list[bytes]] = {}  # the parts that name a block
        self.pinned: list[int] = []  # sources of this step's partial-block copies
        # upstream's vllm:prefix_cache_queries / _hits: prompt tokens looked up / found
        self.prefix_queries = self.prefix_hits = 0

    def blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (cached ones included: they can be taken)."""
        return len(self.free) + len(self.evictable)

    # ---- prefix cache --------------------------------------------------------

    def _hashes(self, seq: Sequence, num_full: int) -> list[bytes]:
        """The chain of hashes of the sequence's first num_full blocks (kept on
        the sequence: its tokens never change)."""
        hashes, bs = seq.block_hashes, self.block_size
        while len(hashes) < num_full:
            parent = hashes[-1] if hashes else root_hash(seq)
            i = len(hashes)
            hashes.append(block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs]))
        return hashes[:num_full]

    def computed_blocks(self, seq: Sequence) -> list[int]:
        """The longest chain of cached blocks that starts the sequence, leaving
        at least its last token to compute (its logits are needed). None for
        a sequence that asks for its prompt's logprobs (as upstream): their
        logits are computed, not cached."""
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []
        found = []
        for h in self._hashes(seq, (len(seq) - 1) // self.block_size):
            block = self.cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def partial_hit(self, seq: Sequence, num_full: int) -> tuple[int, int] | None:
        """(cached block, tokens): the longest part of a cached block that holds
        the sequence's next tokens past its num_full cached blocks, leaving its
        last token to compute; None when no part matches."""
        bs, part = self.block_size, PARTIAL_TOKENS
        if not self.partial or seq.params.prompt_logprobs is not None:
            return None
        start = num_full * bs
        parent = self._hashes(seq, num_full)[-1] if num_full else root_hash(seq)
        longest = min(bs - 1, len(seq) - 1 - start) // part
        for k in range(longest, 0, -1):
            block = self.partial.get(block_hash(parent, seq.token_ids[start:start + k * part]))
            if block is not None:
                return block, k * part
        return None

    def pin(self, block: int) -> None:
        """Keep a copy's source block from being handed out until unpin_all()."""
        self.pinned.append(self._take(block))

    def unpin_all(self) -> None:
        while self.pinned:
            self.unpin_last()

    def unpin_last(self) -> None:
        block = self.pinned.pop()
        if self._drop(block):
            self.free.append(block)

    def count_lookup(self, seq: Sequence, num_hit_tokens: int) -> None:
        """Count an admitted sequence's prompt lookup (once per admission)."""
        if self.enable_prefix_caching:
            self.prefix_queries += len(seq)
            self.prefix_hits += num_hit_tokens

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Name the blocks the sequence has filled and written so far. A block
        whose tokens are cached already (another sequence wrote the same prefix
        at the same time) stays uncached: the first one is kept."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        for i, h in enumerate(self._hashes(seq, full)[seq.num_cached_blocks:],
                              seq.num_cached_blocks):
            block = seq.block_table[i]
            if h not in self.cached and block not in self.hash_of:
                self.cached[h] = block
                self.hash_of[block] = h
        seq.num_cached_blocks = max(seq.num_cached_blocks, full)
        self._name_parts(seq)

    def _name_parts(self, seq: Sequence) -> None:
        """Name the parts written since the last call: each PARTIAL_TOKENS
        more tokens of a block (a whole block has its own name)."""
        bs, part = self.block_size, PARTIAL_TOKENS
        end = min(seq.num_computed_tokens, len(seq.block_table) * bs) // part * part
        for p in range(seq.num_named_tokens + part, end + 1, part):
            i, n = divmod(p, bs)
            if n == 0:
                continue
            parent = seq.block_hashes[i - 1] if i else root_hash(seq)
            h = block_hash(parent, seq.token_ids[i * bs:p])
            if h not in self.partial:  # the first block written with these tokens keeps them
                block = seq.block_table[i]
                self.partial[h] = block
                self.partial_of.setdefault(block, []).append(h)
        seq.num_named_tokens = max(seq.num_named_tokens, end)

    # ---- allocation ----------------------------------------------------------

    def can_allocate(self, seq: Sequence, num_new_tokens: int,
                     computed: list[int] | tuple[int, ...] = (), reserve: int = 0) -> bool:
        """Room for the K/V of num_new_tokens more tokens past its computed
        ones (those include the `computed` blocks the sequence is about to
        take, which leave the free lists if no one holds them), leaving at
        least `reserve` blocks free."""
        have = len(seq.block_table) + len(computed)
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - have
        taken = sum(1 for b in computed if self.ref[b] == 0)
        return max(need, 0) + taken + reserve <= self.num_free

    def allocate(self, seq: Sequence, num_new_tokens: int,
                 computed: list[int] | tuple[int, ...] = ()) -> None:
        """Extend the block table to hold num_new_tokens more tokens; `computed`
        (from computed_blocks, for a sequence holding none) start it."""
        for b in computed:
            self._take(b)
        seq.block_table += computed
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(need):
            seq.block_table.append(self._take(self._pop_free()))

    def _pop_free(self) -> int:
        if self.free:
            return self.free.pop()
        block, _ = self.evictable.popitem(last=False)  # the least recently used
        h = self.hash_of.pop(block, None)
        if h is not None:
            del self.cached[h]
        for h in self.partial_of.pop(block, ()):
            del self.partial[h]
        return block

    def _take(self, block: int) -> int:
        if self.ref[block] == 0:
            self.evictable.pop(block, None)
        self.ref[block] += 1
        return block

    def free_blocks(self, seq: Sequence) -> None:
        """Drop the sequence's references. Its last block is released first, so
        that of its cached blocks the tail is evicted first and the shared
        head is kept longest (as upstream)."""
        uncached = [b for b in reversed(seq.block_table) if self._drop(b)]
        self.free.extend(uncached)  # its first block on top
        seq.block_table = []
        seq.num_cached_blocks = seq.num_named_tokens = 0

    def _drop(self, block: int) -> bool:
        """One reference fewer. True when that frees an unnamed block (the
        caller puts it on the free stack); a named one goes to the LRU list."""
        self.ref[block] -= 1
        if self.ref[block] or (block not in self.hash_of and block not in self.partial_of):
            return self.ref[block] == 0
        self.evictable[block] = None
        return False

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + \
            position % self.block_size
