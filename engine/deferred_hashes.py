"""Prefix-cache hashes of steady-decode blocks, worked out only when a lookup
could reach them (issue 35; docs/fast-paths.md).

A steady-decode member caches one block of its own outputs every
`block_size` steps (engine/steady_caching.py). Hashing it needs the block's
token ids, which the lazy counters have not written: drawing them from the
sampler was most of what prefix caching cost a run in which nothing hits.
So the steady paths *defer* such a block: it is in the cache at once as far
as everything but a lookup can see — `block_hash` is `PENDING`, so it goes
to the free queue's tail when freed and is evicted when taken, exactly as a
hashed block — and its hash, and its entry in the hash map, wait.

A lookup can reach a deferred block only through its chain's parent: the
hash of the request's last block hashed before it (hashes are chained, and
the cache already takes equal hashes for equal prefixes). So the deferred
blocks of a request form one `_Chain` under that parent, and the chain is
*materialised* — its hashes worked out from the request's tokens (the
sampler's where not written), its blocks that are still cached entered into
the map in the order they were cached — before anything could tell:

- a lookup (`BlockPool.get_cached_prefix`) hits the parent: the next hash it
  asks about may be a deferred block's;
- a block is cached whose parent hash is a chain's parent (a block cached
  after a deferred one with its hash would be a duplicate, and duplicates
  are returned first-cached first; `BlockPool.cache_full_blocks`);
- the same request (by id: a request sent again keeps its id and so its
  sampled tokens) caches any block or defers one that does not continue
  its chain;
- `materialize_all` (a single-hash lookup, `get_cached_block`, and checks).

A deferred block taken by an allocation leaves its chain (as an eviction
drops a hash), and a chain whose blocks are all gone is forgotten. Two kinds
of block defer, always past the request's first hashed block: a
steady-decode member's outputs (the deterministic sampler's, never
trimmed), and — while an in-process batch run takes the fast paths
(`KVCacheManager.defer_prompt_hashes`) — blocks wholly in a prompt, whose
content never changes. A prompt's chain goes on with the request's steady
decode blocks. A lookup then needs only the hashes up to its first miss:
when a prompt's first block misses, no other hash of it is worked out.

Prompt blocks
-------------
The chain-parent argument above holds for them as for decode blocks: any
request that could hit a prompt's deferred block looks up, or caches, the
block before it first, so it reaches the chain's parent (the prompt's first
block, or the last one hashed) and materialises the chain. What differs is
only the hash map's contents between such moments, which no lookup sees
(tests/unit/test_deferred_prompt_hashes.py runs two schedulers, one
deferring, by one random script and compares them after every step). The
conformance harness drives schedulers directly, without the flag: its hash
map counts stay vLLM's.

Two prompts that share a prefix can have chains under one parent whose
blocks have equal hashes (the first request's copy of the parent lost its
hash to a failed KV load, `evict_blocks`, so the second missed it and cached
its own). Duplicates are kept first-cached first, so a chain is never
worked out alone while others share its parent: all of them are, their
blocks entered in the order they were deferred (`deferred_at`), which is
the order they were cached in (tests/unit/test_deferred_hashes.py,
`test_chains_under_one_parent_go_in_in_caching_order`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .block_hash import extend_block_hashes

if TYPE_CHECKING:
    from .request import Request


class KVCacheBlock(Protocol):
    """What this module reads and writes of engine/block_pool.py's blocks
    (which imports this module)."""

    block_hash: int | None
    chain: _Chain | None
    deferred_at: int
    is_null: bool


def _first(entry: tuple[int, KVCacheBlock, int]) -> int:
    return entry[0]


# CPython's hash() never returns -1 (it is its error value): a cached block
# whose hash is not worked out yet.
PENDING = -1


class _Chain:
    """A request's deferred blocks: `table[first:next]` (its block table, a
    list that only grows, kept after the request lets it go), those of them
    whose `chain` is this one (the others were cached already, or have been
    taken since), in caching order."""

    __slots__ = ("request", "parent", "table", "first", "next", "live", "tokens_at", "block_size")

    def __init__(
        self,
        request: Request,
        table: Sequence[KVCacheBlock],
        first: int,
        block_size: int,
        tokens_at: Callable[[str, int, int], list[int]],
    ) -> None:
        self.request = request
        self.parent = request.block_hashes[first - 1]
        self.table = table
        self.first = self.next = first
        self.live = 0  # blocks still deferred
        self.tokens_at = tokens_at
        self.block_size = block_size


class DeferredHashes:
    def __init__(self, cache_block: Callable[[KVCacheBlock, int], None]) -> None:
        self._cache_block = cache_block  # `BlockPool.cache_block`
        self.by_parent: dict[int, list[_Chain]] = {}
        self.by_request: dict[str, _Chain] = {}
        self.seq = 0  # deferrals so far: a block's `deferred_at` (the order it was cached in)

    def __len__(self) -> int:
        """Blocks deferred now."""
        return sum(c.live for c in self.by_request.values())  # (every chain is in both maps)

    def defer(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        first: int,
        stop: int,
        block_size: int,
        tokens_at: Callable[[str, int, int], list[int]],
    ) -> None:
        """Cache `blocks[first:stop]` of `request` deferred. `first` is the
        number of hashes the request has (its blocks before are hashed and
        cached) or continues its chain."""
        chain = self.by_request.get(request.request_id)
        if chain is not None and (chain.request is not request or chain.table is not blocks or chain.next != first):
            self.materialize(chain)
            chain = None
        if chain is None:
            chain = _Chain(request, blocks, first, block_size, tokens_at)
            self.by_request[request.request_id] = chain
            self.by_parent.setdefault(chain.parent, []).append(chain)
        seq = self.seq
        for i in range(first, stop):
            block = blocks[i]
            if block.block_hash is not None or block.is_null:
                continue  # (cached already: `cache_block` keeps its entry)
            seq += 1
            block.block_hash = PENDING
            block.chain = chain
            block.deferred_at = seq
        chain.live += seq - self.seq
        self.seq = seq
        chain.next = stop

    def reached(self, block_hash: int) -> None:
        """A lookup hit `block_hash`: materialise the chains under it."""
        chains = self.by_parent.get(block_hash)
        if chains:
            self.materialize(chains[0])  # (and every other chain under it)

    def materialize(self, chain: _Chain) -> None:
        chains = self.by_parent.get(chain.parent)
        if chains is None or len(chains) == 1 or chain not in chains:
            self._materialize(chain)
            return
        # Chains under one parent may hold blocks of equal hashes (prompts
        # sharing a prefix), and duplicates are kept first-cached first: all
        # of them go in, their blocks in the order they were cached.
        entries: list[tuple[int, KVCacheBlock, int]] = []
        for each in list(chains):
            self._forget(each)
            table = each.table
            live = [i for i in range(each.first, each.next) if table[i].chain is each]
            if live:
                hashes = extend_block_hashes(each.request, live[-1] + 1, each.block_size, each.tokens_at)
                entries += [(table[i].deferred_at, table[i], hashes[i]) for i in live]
        entries.sort(key=_first)
        cache_block = self._cache_block
        for _, block, block_hash in entries:
            block.chain = None
            block.block_hash = None
            cache_block(block, block_hash)

    def _materialize(self, chain: _Chain) -> None:
        self._forget(chain)
        table = chain.table
        live = [i for i in range(chain.first, chain.next) if table[i].chain is chain]
        if not live:
            return
        hashes = extend_block_hashes(chain.request, live[-1] + 1, chain.block_size, chain.tokens_at)
        cache_block = self._cache_block
        for i in live:
            block = table[i]
            block.chain = None
            block.block_hash = None
            cache_block(block, hashes[i])

    def materialize_all(self) -> None:
        for chains in list(self.by_parent.values()):
            for chain in list(chains):
                self.materialize(chain)

    def drop(self, block: KVCacheBlock) -> None:
        """A deferred block is evicted (taken for reuse, or its content lost)."""
        chain = block.chain
        block.chain = None
        block.block_hash = None
        if chain is not None:
            chain.live -= 1
            if chain.live == 0:
                self._forget(chain)

    def drop_chain(self, chain: _Chain) -> None:
        """A chain whose blocks have all been taken."""
        self._forget(chain)

    def clear(self) -> None:
        self.by_parent.clear()
        self.by_request.clear()

    def _forget(self, chain: _Chain) -> None:
        chains = self.by_parent.get(chain.parent)
        if chains is not None and chain in chains:
            chains.remove(chain)
            if not chains:
                del self.by_parent[chain.parent]
        if self.by_request.get(chain.request.request_id) is chain:
            del self.by_request[chain.request.request_id]
