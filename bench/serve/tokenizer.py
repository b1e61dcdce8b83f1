"""The simulator's tokenizer: deterministic, shipped with the project, and
exportable as a Hugging Face tokenizer directory (`disagg-sim tokenizer DIR`)
that `AutoTokenizer.from_pretrained(DIR)` loads offline, so a client that
counts tokens (`vllm bench serve --tokenizer DIR`) counts what the server
counts.

Every id of the engine's vocabulary (`engine.sampler.VOCAB_SIZE`) is one
word: 0-2 are `<unk>`, `<s>`, `</s>` (EOS, `engine.sampler.EOS_TOKEN_ID`),
every other id spells itself in three consonant-vowel syllables ("bakoti").
Three more special tokens carry the chat template (`<|system|>`,
`<|user|>`, `<|assistant|>`). Text is split at those special tokens, then
on whitespace; a word outside the vocabulary is `<unk>`. That is exactly a
`tokenizers` WordLevel model with a WhitespaceSplit pre-tokenizer, which is
what the export writes, so no tokenizer library is needed at run time
(`tests/bench/test_serve_tokenizer.py` checks the two agree). Decoding joins
words with one space (the `tokenizers` default without a decoder), so
decode-then-encode of any id sequence gives it back: random-dataset
benchmarks get the prompt lengths they asked for.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from engine.sampler import EOS_TOKEN_ID, VOCAB_SIZE

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
_CONSONANTS = "bdfghjklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 80: three of them name 512,000 words

# The chat template, in Jinja for the exported directory; `ChatTemplate.render`
# below is the same thing in Python. Each message is its role token, a newline,
# its content and a newline; a generation prompt is `<|assistant|>` and a newline.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def _word(token_id: int) -> str:
    n = token_id - 3
    return "".join(_SYLLABLES[(n // 80**k) % 80] for k in (2, 1, 0))


class SimTokenizer:
    """Text <-> the engine's token ids; see the module docstring."""

    def __init__(self) -> None:
        specials = [UNK, BOS, EOS]
        assert specials.index(EOS) == EOS_TOKEN_ID
        self.id_to_token: list[str] = specials + [_word(i) for i in range(3, VOCAB_SIZE)] + list(ROLE_TOKENS.values())
        self.vocab = {t: i for i, t in enumerate(self.id_to_token)}
        self.special_ids = frozenset([0, 1, 2, *range(VOCAB_SIZE, len(self.id_to_token))])
        self.unk_id = 0
        self.eos_id = EOS_TOKEN_ID
        specials_by_length = sorted((self.id_to_token[i] for i in self.special_ids), key=len, reverse=True)
        self._special_re = re.compile("(" + "|".join(re.escape(s) for s in specials_by_length) + ")")

    @property
    def vocab_size(self) -> int:
        return len(self.id_to_token)

    def words(self, text: str) -> list[str]:
        """The pieces text splits into: special tokens, then whitespace-split words."""
        out: list[str] = []
        for i, part in enumerate(self._special_re.split(text)):
            if i % 2:
                out.append(part)
            else:
                out.extend(part.split())
        return out

    def encode(self, text: str) -> list[int]:
        vocab, unk = self.vocab, self.unk_id
        return [vocab.get(w, unk) for w in self.words(text)]

    def content_keys(self, text: str) -> tuple[list[int], list[str]]:
        """The ids and the words they came from: the words tell apart what
        `<unk>` merges, for prefix caching (`prompt_segments`)."""
        words = self.words(text)
        vocab, unk = self.vocab, self.unk_id
        return [vocab.get(w, unk) for w in words], words

    def token_text(self, token_id: int) -> str:
        """The word of one generated id; "" for special tokens (skipped, as vLLM does)."""
        if token_id in self.special_ids or not 0 <= token_id < len(self.id_to_token):
            return ""
        return self.id_to_token[token_id]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            return " ".join(w for w in (self.token_text(i) for i in ids) if w)
        return " ".join(self.id_to_token[i] for i in ids)

    # -- the Hugging Face directory ------------------------------------------------------
    def tokenizer_json(self) -> dict:
        added = [
            {
                "id": i,
                "content": self.id_to_token[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i in sorted(self.special_ids)
        ]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": None,
            "decoder": None,
            "model": {"type": "WordLevel", "vocab": self.vocab, "unk_token": UNK},
        }

    def export(self, directory: str | Path, model_max_length: int = 1 << 20) -> Path:
        """Write `tokenizer.json`, `tokenizer_config.json` and
        `special_tokens_map.json` into `directory` (created if missing)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tokenizer.json").write_text(json.dumps(self.tokenizer_json(), ensure_ascii=False))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": model_max_length,
            "unk_token": UNK,
            "bos_token": BOS,
            "eos_token": EOS,
            "additional_special_tokens": list(ROLE_TOKENS.values()),
            "clean_up_tokenization_spaces": False,
            "add_bos_token": False,
            "add_eos_token": False,
            "chat_template": CHAT_TEMPLATE,
        }
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
        specials = {"unk_token": UNK, "bos_token": BOS, "eos_token": EOS}
        specials["additional_special_tokens"] = list(ROLE_TOKENS.values())  # type: ignore[assignment]
        (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
        return out


def render_chat(messages: list[tuple[str, str]], add_generation_prompt: bool = True) -> str:
    """`CHAT_TEMPLATE` in Python: (role, content) pairs to the prompt text."""
    text = "".join(f"{ROLE_TOKENS[role]}\n{content}\n" for role, content in messages)
    return text + (ROLE_TOKENS["assistant"] + "\n" if add_generation_prompt else "")


def segments_for(keys: list, chunk: int = 16) -> list[tuple[int, int]]:
    """`prompt_segments` for a prompt whose content is `keys` (one per token):
    one segment per `chunk` tokens, keyed by its content. Prompts that share
    their first k chunks share those segments, so prefix caching finds their
    common prefix (the engine chains block hashes; a chunk of 16 divides every
    block size the engine takes)."""
    out = []
    for start in range(0, len(keys), chunk):
        part = "\x00".join(map(str, keys[start : start + chunk]))
        key = int.from_bytes(hashlib.blake2b(part.encode(), digest_size=8).digest(), "big")
        out.append((key, len(keys[start : start + chunk])))
    return out


_TOKENIZER: SimTokenizer | None = None


def get_tokenizer() -> SimTokenizer:
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = SimTokenizer()
    return _TOKENIZER
