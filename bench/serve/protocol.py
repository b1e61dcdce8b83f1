"""OpenAI request parsing and response shapes for `disagg-sim serve`.

One request in, one `ServeRequest` out, or an `ApiError` that becomes
OpenAI's error body (`{"error": {"message", "type", "param", "code"}}`)
with one message that says what is wrong and what is allowed.

What the simulator models is token counts and timing, so the supported
sampling fields are the ones that change those: `max_tokens` /
`max_completion_tokens`, `min_tokens`, `ignore_eos`, `stop_token_ids`,
`priority`, `n` (1 only). Fields that only shape *which* tokens a real model
would pick (temperature, top_p, penalties, seed, ...) are accepted and have
no effect: the simulator's sampler is deterministic by (seed, request id,
position). Anything else that asks for behaviour the simulator does not
have (string `stop`, `logprobs`, `echo`, `best_of`, `tools`, ...) is a 400
unless it is absent, null or its neutral value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .tokenizer import ROLE_TOKENS, SimTokenizer, render_chat

SUPPORTED = "max_tokens / max_completion_tokens, min_tokens, ignore_eos, stop_token_ids, priority, n=1"
# Accepted with any value; they do not change what the simulator does (see the module docstring).
NO_EFFECT = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "user",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "add_special_tokens",
    "metadata",
    "store",
    "request_id",
}
# Accepted only at these neutral values.
NEUTRAL: dict[str, tuple] = {
    "stop": (None, [], ""),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "response_format": (None, {"type": "text"}),
    "prompt_logprobs": (None, 0),
    "add_generation_prompt": (None, True),
}
COMMON = {"model", "stream", "stream_options", "n", "max_tokens", "min_tokens", "ignore_eos", "stop_token_ids"}
COMMON |= {"priority"}
KNOWN = {
    "completions": COMMON | {"prompt"} | NO_EFFECT | set(NEUTRAL),
    "chat": COMMON | {"messages", "max_completion_tokens"} | NO_EFFECT | set(NEUTRAL),
}
CHAT_ROLES = {"system", "developer", "user", "assistant"}
MAX_STOP_TOKEN_IDS = 1024


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
            status, "server_error"
        )

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


# Bounds of a request body's JSON (issue 34): Python's int() refuses 4,300+
# digits and json's decoder recurses per level, both ending in a 500 with a
# traceback. A request needs neither: numbers of at most 30 digits, nesting
# of at most MAX_JSON_DEPTH (messages -> content parts -> fields).
MAX_JSON_INT_DIGITS = 30
MAX_JSON_DEPTH = 32


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise ApiError(400, f"a number of {len(text)} digits; allowed: at most {MAX_JSON_INT_DIGITS}")
    return int(text)


def _json_depth(raw: str) -> int:
    """The deepest nesting of brackets outside strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in raw:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def parse_json_body(raw: str) -> Any:
    """A request body's JSON within the bounds above, or ApiError(400)."""
    if _json_depth(raw) > MAX_JSON_DEPTH:
        raise ApiError(400, f"the request body is nested too deeply; allowed: at most {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(raw, parse_int=_bounded_int)
    except (json.JSONDecodeError, RecursionError):
        raise ApiError(400, "the request body is not valid JSON") from None


@dataclass
class ServeRequest:
    kind: str  # "completions" or "chat"
    model: str
    prompt_ids: list[int]
    prompt_keys: list  # per token: what its content is, for prefix caching
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    priority: int = 0
    stream: bool = False
    include_usage: bool = False


def _int(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        allowed = f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")
        raise ApiError(400, f"{name}={str(value)[:40]} is invalid; allowed: {allowed}", name)
    return value


def _check_fields(body: dict, kind: str) -> None:
    for name in body:
        if name not in KNOWN[kind]:
            also = "the prompt fields, model, stream"
            raise ApiError(400, f"{name!s:.40} is not supported; supported: {SUPPORTED} (and {also})", str(name)[:40])
    for name, allowed in NEUTRAL.items():
        if name in body and body[name] not in allowed:
            raise ApiError(400, f"{name} is not supported by the simulator; supported: {SUPPORTED}", name)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ApiError(400, f"n={str(n)[:20]} is not supported; allowed: n=1", "n")


def _prompt(body: dict, tok: SimTokenizer) -> tuple[list[int], list]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids, words = tok.content_keys(prompt)
        return ids, words
    if isinstance(prompt, list) and all(type(x) is int for x in prompt):
        if any(not 0 <= x < tok.vocab_size for x in prompt):
            raise ApiError(400, f"prompt token ids must be in [0, {tok.vocab_size})", "prompt")
        return list(prompt), [tok.id_to_token[x] for x in prompt]
    raise ApiError(
        400, "prompt is invalid; allowed: one string or one list of token ids (one prompt per request)", "prompt"
    )


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "\n".join(str(p.get("text", "")) for p in content)
    raise ApiError(400, f"messages[{i}].content is invalid; allowed: a string or a list of text parts", "messages")


def _messages(body: dict, tok: SimTokenizer) -> tuple[list[int], list]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages is required: a non-empty list of {role, content}", "messages")
    pairs = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in CHAT_ROLES:
            raise ApiError(400, f"messages[{i}].role is invalid; allowed: {', '.join(sorted(CHAT_ROLES))}", "messages")
        pairs.append(("system" if role == "developer" else role, _content(m, i)))
    text = render_chat(pairs, add_generation_prompt=body.get("add_generation_prompt") is not False)
    assert all(r in ROLE_TOKENS for r, _ in pairs)
    return tok.content_keys(text)


def parse_request(body: Any, kind: str, tok: SimTokenizer, model: str, max_model_len: int) -> ServeRequest:
    """A request body to a `ServeRequest`, or an `ApiError` naming the problem."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_fields(body, kind)
    if body.get("model") not in (None, model):
        raise ApiError(404, f"The model `{str(body.get('model'))[:80]}` does not exist; served: {model}", "model")
    ids, keys = _prompt(body, tok) if kind == "completions" else _messages(body, tok)
    if not ids:
        raise ApiError(400, "the prompt is empty; allowed: at least one token", "prompt")
    room = max_model_len - len(ids)
    if room < 1:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
            f"{len(ids)} tokens; allowed: at most {max_model_len - 1}",
            "prompt" if kind == "completions" else "messages",
        )
    name = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, name, 1)
    if max_tokens is None:
        max_tokens = 16 if kind == "completions" else room  # OpenAI's and vLLM's defaults
    if max_tokens > room:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the completion); "
            f"allowed: {name} <= {room}",
            name,
        )
    min_tokens = _int(body, "min_tokens", 0, max_tokens) or 0
    priority = _int(body, "priority", -(2**31), 2**31 - 1) or 0
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ApiError(400, "ignore_eos is invalid; allowed: true or false", "ignore_eos")
    stop_ids = body.get("stop_token_ids") or []
    if (
        not isinstance(stop_ids, list)
        or len(stop_ids) > MAX_STOP_TOKEN_IDS
        or not all(type(x) is int and 0 <= x < tok.vocab_size for x in stop_ids)
    ):
        raise ApiError(
            400,
            f"stop_token_ids is invalid; allowed: a list of at most {MAX_STOP_TOKEN_IDS} ids in [0, {tok.vocab_size})",
            "stop_token_ids",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise ApiError(400, "stream is invalid; allowed: true or false", "stream")
    options = body.get("stream_options")
    if options is not None and (
        not isinstance(options, dict)
        or set(options) - {"include_usage"}
        or not isinstance(options.get("include_usage", False), bool)
    ):
        raise ApiError(400, "stream_options is invalid; allowed: {include_usage: bool}", "stream_options")
    if options is not None and not stream:
        raise ApiError(400, "stream_options is only allowed when stream is true", "stream_options")
    return ServeRequest(
        kind=kind,
        model=model,
        prompt_ids=ids,
        prompt_keys=keys,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=ignore_eos,
        stop_token_ids=list(stop_ids),
        priority=priority,
        stream=bool(stream),
        include_usage=bool(options and options.get("include_usage")),
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
