"""vLLM 0.5.3.post1's default block manager, `BlockSpaceManagerV1`
(`vllm/core/block_manager_v1.py`), without prefix caching or sliding window.

The rules a simulator must copy, because they decide admission and preemption:
- admission (`can_allocate`) reserves the WHOLE sequence and keeps a watermark
  of `int(0.01 * num_gpu_blocks)` blocks free (0 below 100 blocks);
- a decode (`can_append_slots`) needs ONE FREE BLOCK PER RUNNING SEQUENCE even
  when its last block still has room, and ignores the watermark;
- swap-in needs the group's blocks plus one per swapped sequence, above the
  watermark; swap-out needs as many free CPU blocks as the group holds.
"""

from __future__ import annotations

import enum

from engine.v0.sequence import Sequence, SequenceGroup, SequenceStatus


class AllocStatus(enum.Enum):
    """OK: allocate now. LATER: not now, the pool could hold it. NEVER: the pool
    (minus the watermark) can never hold it."""

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


class Device(enum.Enum):
    GPU = enum.auto()
    CPU = enum.auto()


class UncachedBlockAllocator:
    """A LIFO free list, like vLLM's: the last freed block is reused first.

    Blocks are plain numbers (vLLM wraps them in `PhysicalTokenBlock`s); with
    n=1 and no prefix caching a block has one owner, so a per-block
    "allocated" flag stands in for the reference count and still catches a
    double free."""

    def __init__(self, device: Device, num_blocks: int) -> None:
        self.device = device
        self.num_blocks = num_blocks
        # vLLM builds the list in block order and pops from its end.
        self.free_blocks: list[int] = list(range(num_blocks))
        self._allocated = bytearray(num_blocks)

    def allocate(self) -> int:
        if not self.free_blocks:
            raise ValueError(f"Out of memory! No free {self.device.name} blocks are available.")
        block = self.free_blocks.pop()
        self._allocated[block] = 1
        return block

    def free(self, block: int) -> None:
        if not self._allocated[block]:
            raise ValueError(f"Double free! {self.device.name} block {block} is already freed.")
        self._allocated[block] = 0
        self.free_blocks.append(block)

    def get_num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def get_num_total_blocks(self) -> int:
        return self.num_blocks


# A sequence's block numbers, in logical order, on the device its sequence is on.
BlockTable = list[int]


class BlockSpaceManagerV1:
    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float = 0.01) -> None:
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.watermark = watermark
        # Same float expression as vLLM so the truncation agrees bit for bit.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.gpu_allocator = UncachedBlockAllocator(Device.GPU, num_gpu_blocks)
        self.cpu_allocator = UncachedBlockAllocator(Device.CPU, num_cpu_blocks)
        self.block_tables: dict[int, BlockTable] = {}
        # Sequences whose table holds CPU blocks (swapped out); all others are on the GPU.
        self._on_cpu: set[int] = set()

    # -- admission -----------------------------------------------------------
    def num_required_blocks(self, seq_group: SequenceGroup) -> int:
        return seq_group.get_seqs(status=SequenceStatus.WAITING)[0].n_blocks

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        required = self.num_required_blocks(seq_group)
        if self.num_total_gpu_blocks - required < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.gpu_allocator.get_num_free_blocks() - required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, seq_group: SequenceGroup) -> None:
        seq = seq_group.get_seqs(status=SequenceStatus.WAITING)[0]
        allocate = self.gpu_allocator.allocate
        self.block_tables[seq.seq_id] = [allocate() for _ in range(seq.n_blocks)]

    # -- decode --------------------------------------------------------------
    def can_append_slots(self, seq_group: SequenceGroup) -> bool:
        # vLLM's "simple heuristic": one free block per running sequence,
        # whether or not the next token needs a new block.
        return seq_group.num_seqs(status=SequenceStatus.RUNNING) <= len(self.gpu_allocator.free_blocks)

    def append_slots(self, seq: Sequence) -> None:
        """Make room for the sequence's current length: at most one new block
        (n=1 never shares a block, so no copy-on-write)."""
        block_table = self.block_tables[seq.seq_id]
        missing = -(-seq._len // self.block_size) - len(block_table)
        if missing > 0:
            if missing != 1:
                raise AssertionError(f"sequence {seq.seq_id} needs {missing} new blocks; v0 appends one")
            block_table.append(self.gpu_allocator.allocate())

    # -- swap ----------------------------------------------------------------
    def _group_blocks(self, seq_group: SequenceGroup) -> list[int]:
        blocks: list[int] = []
        for seq in seq_group.get_seqs():
            if not seq.is_finished():
                blocks.extend(self.block_tables[seq.seq_id])
        return blocks

    def can_swap_in(self, seq_group: SequenceGroup) -> AllocStatus:
        # Conservatively one extra block per sequence for the append that follows.
        required = len(self._group_blocks(seq_group)) + seq_group.num_seqs(status=SequenceStatus.SWAPPED)
        if self.gpu_allocator.get_num_total_blocks() < required:
            return AllocStatus.NEVER
        if self.gpu_allocator.get_num_free_blocks() - required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        return len(self._group_blocks(seq_group)) <= self.cpu_allocator.get_num_free_blocks()

    def _move(self, seq: Sequence, src: UncachedBlockAllocator, dst: UncachedBlockAllocator) -> list[tuple[int, int]]:
        mapping: list[tuple[int, int]] = []
        new_table: BlockTable = []
        for block in self.block_tables[seq.seq_id]:
            to_block = dst.allocate()
            new_table.append(to_block)
            mapping.append((block, to_block))
            src.free(block)
        self.block_tables[seq.seq_id] = new_table
        return mapping

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Returns (cpu block, gpu block) pairs."""
        mapping: list[tuple[int, int]] = []
        for seq in seq_group.get_seqs(status=SequenceStatus.SWAPPED):
            mapping.extend(self._move(seq, self.cpu_allocator, self.gpu_allocator))
            self._on_cpu.discard(seq.seq_id)
        return mapping

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Returns (gpu block, cpu block) pairs."""
        mapping: list[tuple[int, int]] = []
        for seq in seq_group.get_seqs(status=SequenceStatus.RUNNING):
            mapping.extend(self._move(seq, self.gpu_allocator, self.cpu_allocator))
            self._on_cpu.add(seq.seq_id)
        return mapping

    # -- free ----------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        block_table = self.block_tables.pop(seq.seq_id, None)
        if block_table is None:  # already freed, or never scheduled
            return
        if seq.seq_id in self._on_cpu:
            self._on_cpu.discard(seq.seq_id)
            allocator = self.cpu_allocator
        else:
            allocator = self.gpu_allocator
        for block in block_table:
            allocator.free(block)

    def get_block_table(self, seq: Sequence) -> list[int]:
        """A copy of the sequence's block numbers (vLLM returns a fresh list too)."""
        return list(self.block_tables[seq.seq_id])

    def get_num_free_gpu_blocks(self) -> int:
        return self.gpu_allocator.get_num_free_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu_allocator.get_num_free_blocks()

    def check_conservation(self) -> list[str]:
        """Problems with the pools: every block either free or in exactly one
        table of its device, and no block free twice. Empty when all is well."""
        problems = []

        def on_gpu(sid: int) -> bool:
            return sid not in self._on_cpu

        def on_cpu(sid: int) -> bool:
            return sid in self._on_cpu

        for allocator, on_device in ((self.gpu_allocator, on_gpu), (self.cpu_allocator, on_cpu)):
            held = [b for sid, table in self.block_tables.items() if on_device(sid) for b in table]
            free = allocator.free_blocks
            name = allocator.device.name
            if len(free) != len(set(free)):
                problems.append(f"a {name} block is in the free list twice (double free)")
            if len(held) != len(set(held)):
                problems.append(f"a {name} block is in two block tables")
            if len(free) + len(held) != allocator.num_blocks or set(free) & set(held):
                problems.append(
                    f"{name} blocks not conserved: free {len(free)} + held {len(held)} != "
                    f"{allocator.num_blocks}, or a held block is also free"
                )
        return problems
