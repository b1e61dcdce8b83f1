"""Block hashes for prefix caching, chained as vLLM chains them: block i's
hash covers its parent's hash and its own tokens, so equal hashes mean equal
prefixes. Only full blocks are hashed. Hashes are computed lazily, as far as
the request's known tokens reach (vLLM updates them as tokens are appended;
the result is the same).

vLLM hashes with sha256 over its serialised tokens; here Python's `hash` of
(parent, content) does: hashes are only compared within one process, and
content is either the block's token ids or, for synthetic prompts, the
(segment key, offset, length) that stands for them (`engine/prompt.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .request import UNSAMPLED, Request


def prompt_block_hashes(prompt: Sequence[int], block_size: int) -> list[int]:
    """The hashes of a prompt's full blocks, as a request holding it gets them."""
    return _extend([], prompt, (), len(prompt), block_size)


def update_block_hashes(request: Request, block_size: int) -> list[int]:
    """Extend `request.block_hashes` to every full block of its known tokens."""
    hashes = request.block_hashes
    if len(hashes) >= request.num_tokens // block_size:
        return hashes
    return _extend(hashes, request.prompt_token_ids, request.output_token_ids, request.num_tokens, block_size)


def first_block_hash(request: Request, block_size: int) -> list[int]:
    """`request.block_hashes`, extended to its first block if it has none
    (the caller knows the request holds a full block)."""
    hashes = request.block_hashes
    if hashes:
        return hashes
    return _extend(hashes, request.prompt_token_ids, request.output_token_ids, block_size, block_size)


def extend_block_hashes(
    request: Request, num_blocks: int, block_size: int, tokens_at: Callable[[str, int, int], list[int]]
) -> list[int]:
    """`update_block_hashes` as far as `num_blocks` blocks, for a steady-decode
    member whose counters are written lazily (engine/steady_cohort.py): its
    outputs past those written are the sampler's (`tokens_at(request id,
    first position, count)`), drawn here."""
    hashes = request.block_hashes
    have = len(hashes)
    if have >= num_blocks:
        return hashes
    start = have * block_size
    if num_blocks == have + 1 and start >= request.num_prompt_tokens + len(request._output_token_ids):
        # The usual case: one block past the prompt and past the written outputs.
        ids = tokens_at(request.request_id, start, block_size)
        hashes.append(output_block_hash(hashes[-1] if hashes else None, ids))
        return hashes
    output = _SampledOutput(request, tokens_at)
    return _extend(hashes, request.prompt_token_ids, output, num_blocks * block_size, block_size)  # type: ignore[arg-type]


class _SampledOutput:
    """A request's output ids by slice: the written ones (an UNSAMPLED one
    drawn), then the sampler's."""

    __slots__ = ("_written", "_tokens_at", "_rid", "_prompt_len")

    def __init__(self, request: Request, tokens_at: Callable[[str, int, int], list[int]]) -> None:
        self._written = request._output_token_ids
        self._tokens_at = tokens_at
        self._rid = request.request_id
        self._prompt_len = request.num_prompt_tokens

    def __getitem__(self, window: slice) -> list[int]:
        start, stop = window.start or 0, window.stop
        written = self._written
        n = len(written)
        head = written[start:stop] if start < n else []
        if UNSAMPLED in head:
            head = [self._tokens_at(self._rid, self._prompt_len + i, 1)[0] if t == UNSAMPLED else t
                    for i, t in enumerate(head, start)]  # fmt: skip
        first = start + len(head)
        if first >= stop:
            return head
        return head + self._tokens_at(self._rid, self._prompt_len + first, stop - first)


def _extend(
    hashes: list[int], prompt: Sequence[int], output: Sequence[int], num_tokens: int, block_size: int
) -> list[int]:
    """Append the hashes of the full blocks of prompt + output up to `num_tokens`."""
    num_prompt = len(prompt)
    block_key = getattr(prompt, "block_key", None)
    # A prompt of one segment (every prompt of its own): its block keys are
    # plain tuples, built here without a call per block (`PromptTokens.block_key`).
    key = prompt.single_key() if block_key else None  # type: ignore[attr-defined]
    parent = hashes[-1] if hashes else None
    for i in range(len(hashes), num_tokens // block_size):
        start = i * block_size
        end = start + block_size
        content: object
        if end <= num_prompt:
            if key is not None:
                content = (key, start, block_size)
            else:
                content = block_key(start, end) if block_key else tuple(prompt[start:end])
        elif start >= num_prompt:
            parent = output_block_hash(parent, output[start - num_prompt : end - num_prompt])
            hashes.append(parent)
            continue
        else:
            if key is not None:
                head: object = (key, start, num_prompt - start)
            else:
                head = block_key(start, num_prompt) if block_key else tuple(prompt[start:num_prompt])
            content = (head, tuple(output[: end - num_prompt]))
        parent = hash((parent, content))
        hashes.append(parent)
    return hashes


def output_block_hash(parent: int | None, ids: Sequence[int]) -> int:
    """The hash of a block past the prompt, holding output ids `ids`."""
    return hash((parent, tuple(ids)))
