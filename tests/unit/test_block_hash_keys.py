"""Prompt block hashes (engine/block_hash.py) stand for a synthetic prompt's
tokens by `PromptTokens.block_key`; a prompt of one segment has its keys
built inline. Both ways give the same chained hashes, whole blocks and the
block that holds the prompt's tail and the first outputs alike."""

from __future__ import annotations

import pytest

from engine.block_hash import prompt_block_hashes, update_block_hashes
from engine.prompt import PromptTokens
from engine.request import Request, SamplingParams


def _reference(prompt: PromptTokens, outputs: list[int], block_size: int) -> list[int]:
    """The chain written out with `block_key` for every prompt part."""
    tokens = len(prompt) + len(outputs)
    hashes: list[int] = []
    parent = None
    for i in range(tokens // block_size):
        start, end = i * block_size, (i + 1) * block_size
        if end <= len(prompt):
            content: object = prompt.block_key(start, end)
        elif start >= len(prompt):
            content = tuple(outputs[start - len(prompt) : end - len(prompt)])
        else:
            content = (prompt.block_key(start, len(prompt)), tuple(outputs[: end - len(prompt)]))
        parent = hash((parent, content))
        hashes.append(parent)
    return hashes


@pytest.mark.parametrize(
    "prompt",
    [
        PromptTokens.unique("req-7", 53),
        PromptTokens.unique("req-8", 64),
        PromptTokens([(11, 20), (12, 33)]),  # two segments: a block spans both
        PromptTokens([(11, 48)]),  # one shared segment
    ],
)
def test_prompt_block_hashes_are_those_of_their_block_keys(prompt: PromptTokens) -> None:
    bs = 16
    assert prompt_block_hashes(prompt, bs) == _reference(prompt, [], bs)
    request = Request("r", prompt, SamplingParams(max_tokens=40))
    outputs = [100 + i for i in range(30)]
    request.append_output_token_ids(outputs)
    assert update_block_hashes(request, bs) == _reference(prompt, outputs, bs)
    if len(prompt.segments) == 1:
        assert prompt.single_key() == prompt.segments[0][0]
    else:
        assert prompt.single_key() is None
