"""Prefix caching on the steady paths (issue 15; docs/fast-paths.md).

On the plain path `allocate_slots` caches, at every step, the blocks the
step's tokens complete: it enters them into the prefix cache under their
chained hashes, which cover the blocks' token ids. A steady-decode member
completes one block every `block_size` steps (the step before it takes the
next one), so the steady paths cache exactly those blocks at exactly those
steps (`SteadyCohort.cachers`), before the step's frees put any block back:
the cache, the blocks' hashes and the free queue's order (hashed blocks go
to its tail) are the plain path's.

The members' counters are written lazily, so the ids of their newest
tokens are not in their output lists yet; they are the deterministic
sampler's, and `SteadyCaching` draws every window of them a forward's steps
hash in one numpy pass (`DeterministicSampler.token_windows`) — a block's
worth of ids per block was most of the cost of prefix caching here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .deferred_hashes import PENDING
from .request import Request

if TYPE_CHECKING:
    from .kv_cache_manager import KVCacheManager
    from .sampler import DeterministicSampler
    from .steady_cohort import SteadyCohort


# Below this many ids a Python loop draws them faster than numpy's fixed cost.
_NUMPY_FROM = 40
_NO_MEMBERS: list[Request] = []  # (a step no member completes a block in; never written)


class SteadyCaching:
    """The blocks the members complete in steps 1..m of a steady run, and
    the sampler's ids the hashes of those hashed at once need, drawn up
    front (most are deferred: engine/deferred_hashes.py)."""

    def __init__(
        self,
        kvm: KVCacheManager,
        sampler: DeterministicSampler,
        cohort: SteadyCohort,
        base: int,
        finishing: list[list[Request]],
        m: int,
    ) -> None:
        self.kvm = kvm
        self._tokens_at = sampler.tokens_at
        self.base = base
        bs = kvm.block_size
        # Per step j (absolute base + j): the members whose tokens complete a
        # block then (a member has `steady_offset + base + j` tokens).
        self.steps: list[list[Request]] = [[]]
        # The sampler's ids each block to hash reads, as (request id, first
        # position, count): its positions past the prompt and past the
        # outputs written so far (`block_hash._SampledOutput` asks for
        # exactly these); a block once.
        windows: list[tuple[str, int, int]] = []
        hashed: set[Request] = set()  # members whose first block's window is listed
        ended: set[Request] = set()  # finished at an earlier step
        by_residue = cohort.by_residue
        for j in range(1, m + 1):
            step = base + j
            members = by_residue[(step + 1) % bs]  # (`SteadyCohort.cachers`, inline)
            if not members:
                self.steps.append(_NO_MEMBERS)
                if finishing[j]:
                    ended.update(finishing[j])
                continue
            entries = [r for r in members if r not in ended] if ended else list(members)
            for r in entries:
                if r.block_hashes or r in hashed:
                    continue  # its blocks are cached with their hashes deferred (engine/deferred_hashes.py)
                # No block hashed yet (a prompt shorter than a block): its
                # first block is hashed when cached, the rest deferred.
                hashed.add(r)
                first = r.num_prompt_tokens + len(r._output_token_ids)
                if first < bs:
                    windows.append((r.request_id, first, bs - first))
            self.steps.append(entries)
            if finishing[j]:
                ended.update(finishing[j])
        if not windows:
            self._ready: dict[tuple[str, int], list[int]] = {}
            return
        if sum(n for _, _, n in windows) < _NUMPY_FROM:
            drawn = [sampler.tokens_at(*w) for w in windows]
        else:
            drawn = sampler.token_windows(windows)
        self._ready = {(rid, first): ids for (rid, first, _), ids in zip(windows, drawn)}

    def tokens_at(self, request_id: str, first: int, n: int) -> list[int]:
        ids = self._ready.get((request_id, first))
        if ids is not None and len(ids) == n:
            return ids
        return self._tokens_at(request_id, first, n)

    def step(self, j: int) -> None:
        """Cache the blocks step j completes, in running order."""
        kvm = self.kvm
        bs, num_cached_block, tables = kvm.block_size, kvm.num_cached_block, kvm.req_to_blocks
        deferred = kvm.block_pool.deferred
        chains = deferred.by_request
        step = self.base + j
        seq = deferred.seq
        for r in self.steps[j]:
            # The usual case inline: one block, continuing the member's
            # deferred chain (`DeferredHashes.defer`).
            rid = r.request_id
            num_tokens = r.steady_offset + step
            i = num_tokens // bs - 1
            chain = chains.get(rid)
            if chain is not None and chain.next == i and chain.request is r and num_cached_block.get(rid) == i:
                table = tables[rid]
                block = table[i]
                if chain.table is table and block.block_hash is None and not block.is_null:
                    seq += 1
                    block.block_hash = PENDING
                    block.chain = chain
                    block.deferred_at = seq
                    chain.live += 1
                    chain.next = i + 1
                    num_cached_block[rid] = i + 1
                    continue
            deferred.seq = seq
            kvm.cache_steady_blocks(r, num_tokens, self.tokens_at, self._tokens_at)
            seq = deferred.seq
        deferred.seq = seq
