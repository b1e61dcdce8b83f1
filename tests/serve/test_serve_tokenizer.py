"""The shipped tokenizer: round trips, the chat template, and agreement with
the Hugging Face directory it exports (read by `tokenizers` here, and by
`transformers.AutoTokenizer` in the vLLM oracle venv when it is built)."""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest

from bench.cli import main
from bench.serve.tokenizer import CHAT_TEMPLATE, get_tokenizer, render_chat, segments_for
from engine.sampler import EOS_TOKEN_ID, VOCAB_SIZE

TEXTS = [
    "Hello, world!  tabs\tand\nnewlines",
    "bakoti bodetu <|user|>x</s>y<s>",
    render_chat([("system", "be brief"), ("user", "say bakoti twice")]),
    "",
    "   ",
    "ünïcödé wörds and bakoti",
]


def test_every_engine_id_round_trips():
    tok = get_tokenizer()
    assert tok.vocab_size == VOCAB_SIZE + 3
    assert tok.id_to_token[EOS_TOKEN_ID] == "</s>"
    ids = list(range(3, VOCAB_SIZE))
    assert tok.encode(tok.decode(ids)) == ids
    assert len(set(tok.id_to_token)) == tok.vocab_size  # one word per id


def test_chat_template_and_unknown_words():
    tok = get_tokenizer()
    text = render_chat([("user", "hi bakoti")])
    assert text == "<|user|>\nhi bakoti\n<|assistant|>\n"
    assert tok.encode(text) == [VOCAB_SIZE + 1, 0, tok.vocab["bakoti"], VOCAB_SIZE + 2]
    assert tok.decode([EOS_TOKEN_ID, tok.vocab["bakoti"], 0]) == "bakoti"  # specials skipped


def test_segments_share_exactly_the_common_chunks():
    a = segments_for(list(range(40)))
    b = segments_for(list(range(32)) + [99] * 8)
    assert [n for _, n in a] == [16, 16, 8]
    assert a[:2] == b[:2] and a[2] != b[2]


def test_exported_directory_agrees_with_tokenizers(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    assert main(["tokenizer", str(tmp_path / "tok")]) == 0
    files = sorted(p.name for p in (tmp_path / "tok").iterdir())
    assert files == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    tok = get_tokenizer()
    rng = random.Random(0)
    ids = [rng.randrange(tok.vocab_size) for _ in range(2000)]
    text = tok.decode(ids, skip_special_tokens=False)
    assert hf.encode(text).ids == tok.encode(text) == ids
    for text in TEXTS:
        assert hf.encode(text).ids == tok.encode(text), text
    assert hf.decode(ids) == tok.decode(ids)
    assert hf.get_vocab_size() == tok.vocab_size


AUTO_SCRIPT = """
import json, sys
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
texts = json.loads(sys.argv[2])
chat = t.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                             tokenize=False, add_generation_prompt=True)
print(json.dumps({"ids": [t.encode(x, add_special_tokens=False) for x in texts], "chat": chat,
                  "vocab_size": t.vocab_size, "eos": t.eos_token_id, "specials": sorted(t.all_special_ids)}))
"""


def test_auto_tokenizer_loads_it_offline(tmp_path):
    from .oracle import launch

    oracle_python = launch.oracle_python
    reason = launch.oracle_missing_reason("v1")
    if reason:
        pytest.skip(f"transformers lives in the vLLM oracle venv, which is not built: {reason}")
    get_tokenizer().export(tmp_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run(
        [str(oracle_python("v1")), "-c", AUTO_SCRIPT, str(tmp_path), json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    tok = get_tokenizer()
    assert got["ids"] == [tok.encode(x) for x in TEXTS]
    assert got["chat"] == render_chat([("system", "be brief"), ("user", "hi")])
    assert got["vocab_size"] == tok.vocab_size
    assert got["eos"] == EOS_TOKEN_ID
    assert got["specials"] == sorted(tok.special_ids)
    assert "{% for message in messages %}" in CHAT_TEMPLATE
