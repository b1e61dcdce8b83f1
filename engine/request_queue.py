"""Waiting queues (vLLM's `vllm/v1/core/sched/request_queue.py`): FCFS is a
deque; PRIORITY is a heap ordered by (priority, arrival_time, request_id)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator

from .request import Request


class FCFSRequestQueue(deque[Request]):
    def add_request(self, request: Request) -> None:
        self.append(request)

    def pop_request(self) -> Request:
        return self.popleft()

    def peek_request(self) -> Request:
        if not self:
            raise IndexError("peek from an empty queue")
        return self[0]

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """`requests` comes in reverse order (built with appendleft), so
        extendleft restores the original order at the head."""
        self.extendleft(requests)

    def remove_request(self, request: Request) -> None:
        self.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = set(requests)
        kept = [r for r in self if r not in to_remove]
        self.clear()
        self.extend(kept)


class PriorityRequestQueue:
    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    def pop_request(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0]

    def prepend_request(self, request: Request) -> None:
        # Priority order decides position; "prepend" is an ordinary insert.
        # (A def, not `prepend_request = add_request`: mypyc drops such a
        # class-body alias; docs/compiled.md.)
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for r in requests:
            heapq.heappush(self._heap, r)

    def remove_request(self, request: Request) -> None:
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = set(requests)
        self._heap = [r for r in self._heap if r not in to_remove]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(self._heap))


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"policy={policy!r} is invalid; allowed: 'fcfs' or 'priority'")
