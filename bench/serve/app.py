"""The OpenAI-compatible HTTP front door of `disagg-sim serve`, on aiohttp.

One implementation of the HTTP surface for both runtimes: it talks to a
`streams.ServeDriver` — the paced in-process cluster (`driver.py`) or the
Ray proxy's router, inside the proxy actor (`ray_front.py`).

Why aiohttp: the front door has to stream (SSE), notice a client that goes
away, and share one asyncio loop with the driver.
aiohttp does all three in one well-kept package with no ASGI server next to
it, and its handler cancellation turns a dropped connection into a
`CancelledError` in the handler, which is where the request is aborted.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
GET /health, GET /metrics. Request fields and errors: `protocol.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from .guard import ConnectionGuard, ServeLimits, api_key_middleware
from .protocol import ApiError, ServeRequest, parse_json_body, parse_request, usage
from .streams import ServeDriver, Stream
from .tokenizer import SimTokenizer

MAX_BODY_BYTES = 8 << 20

logger = logging.getLogger("bench.serve")


def _unknown_model(name: object, served: str) -> ApiError:
    return ApiError(404, f"The model `{str(name)[:80]}` does not exist; served: {served}", "model")


def _error(err: ApiError) -> web.Response:
    response = web.json_response(err.body(), status=err.status)
    if err.status == 408:
        response.force_close()  # the rest of the body may still be on its way
    return response


async def read_json(request: web.Request, timeout_s: float = ServeLimits.body_timeout_s) -> Any:
    """The body's JSON within `parse_json_body`'s bounds; a body past
    MAX_BODY_BYTES is a 413 in OpenAI's error shape, not aiohttp's text/plain;
    a body not in whole within `timeout_s` is a 408 (and the connection closes)."""
    try:
        # A timeout scope, not wait_for: no task in between, so a body that is
        # already in is read at once (before a client that has left is noticed).
        async with asyncio.timeout(timeout_s):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(
            413, f"the request body is larger than {MAX_BODY_BYTES:,} bytes", kind="invalid_request_error"
        ) from None
    except TimeoutError:
        raise ApiError(
            408, f"the request body did not arrive within {timeout_s:g} s", kind="invalid_request_error"
        ) from None
    try:
        return parse_json_body(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not valid JSON") from None


class ServeApp:
    def __init__(
        self,
        driver: ServeDriver,
        tokenizer: SimTokenizer,
        model_name: str,
        render_metrics: Callable[[], Awaitable[bytes]] | None = None,
        api_keys: Sequence[str] = (),
        limits: ServeLimits | None = None,
    ) -> None:
        self.driver = driver
        self.tok = tokenizer
        self.model = model_name
        self.render_metrics = render_metrics
        self.created = int(time.time())
        self.aborted = 0  # requests whose client went away before the end
        self.limits = limits or ServeLimits()
        self.guard = ConnectionGuard(self.limits)
        middlewares = [self.guard.middleware]
        if api_keys:
            middlewares.append(api_key_middleware(list(api_keys)))
        self.app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=middlewares)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/tokenize", self.tokenize)
        self.app.router.add_post("/detokenize", self.detokenize)
        self.app.router.add_get("/health", self.health)
        self.app.router.add_get("/metrics", self.metrics)
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)

    async def query(self, name: str, *args: Any) -> Any:
        """The front door's own counts, else `ServeDriver.query` (tests, tools)."""
        if name == "client_aborts_seen_by_app":
            return self.aborted
        if name == "connections":
            return self.guard.counts()
        return await self.driver.query(name, *args)

    async def _on_startup(self, _app: web.Application) -> None:
        self.driver.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.driver.stop()

    # -- plain routes -------------------------------------------------------------------
    async def models(self, _request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "disagg-sim",
            "root": self.model,
            "max_model_len": self.driver.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _body(self, request: web.Request) -> dict:
        body = await read_json(request, self.limits.body_timeout_s)
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if body.get("model") not in (None, self.model):
            raise _unknown_model(body.get("model"), self.model)
        return body

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize (`vllm bench serve` checks its prompts against it)."""
        try:
            body = await self._body(request)
            if "messages" in body:
                ids = parse_request({"messages": body["messages"]}, "chat", self.tok, self.model, 1 << 30).prompt_ids
            elif isinstance(body.get("prompt"), str):
                ids = self.tok.encode(body["prompt"])
            else:
                raise ApiError(400, "prompt is invalid; allowed: a string (or messages)", "prompt")
        except ApiError as err:
            return _error(err)
        return web.json_response(
            {"count": len(ids), "max_model_len": self.driver.max_model_len, "tokens": ids, "token_strs": None}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(type(x) is int and 0 <= x < self.tok.vocab_size for x in ids):
                allowed = f"a list of ids in [0, {self.tok.vocab_size})"
                raise ApiError(400, f"tokens is invalid; allowed: {allowed}", "tokens")
        except ApiError as err:
            return _error(err)
        return web.json_response({"prompt": self.tok.decode(ids, skip_special_tokens=False)})

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, _request: web.Request) -> web.Response:
        if self.render_metrics is None:
            return web.Response(status=404, text="metrics are off\n")
        self.driver.advance()
        return web.Response(body=await self.render_metrics(), content_type="text/plain", charset="utf-8")

    # -- generation ---------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            body = await read_json(request, self.limits.body_timeout_s)
            req = parse_request(body, kind, self.tok, self.model, self.driver.max_model_len)
            stream = self.driver.submit(req)
        except ApiError as err:
            return _error(err)
        finished = False
        try:
            if req.stream:
                response = await self._stream(request, req, stream)
            else:
                response = await self._whole(req, stream)
            finished = True
            return response
        finally:
            # A client that went away (the handler is cancelled, or a write
            # failed): the request is aborted in the engine, its blocks freed.
            # One INFO line: a client leaving is not a server error.
            gone = not finished or stream.client_gone
            rec = stream.record
            if gone and rec.finish_reason is None:
                self.aborted += 1
                self.driver.abort(stream)
                what = "aborted"
            else:
                self.driver.release(stream)
                what = f"finished {rec.finish_reason}"
            if gone:
                logger.info(
                    "client went away: %s (%d tokens generated of max_tokens %d; %s)",
                    stream.request_id,
                    stream.seen,
                    req.max_tokens,
                    what,
                )

    async def _wait(self, stream: Stream) -> None:
        stream.changed.clear()
        rec = stream.record
        if len(rec.output_token_ids) == stream.seen and rec.finish_reason is None:
            await stream.changed.wait()

    def _finish_reason(self, stream: Stream) -> str:
        reason = stream.record.finish_reason
        if reason == "error":
            raise ApiError(500, f"the simulated cluster failed the request {stream.request_id}")
        return "stop" if reason == "stop" else "length"

    async def _whole(self, req: ServeRequest, stream: Stream) -> web.Response:
        rec = stream.record
        while rec.finish_reason is None:
            await self._wait(stream)
            stream.seen = len(rec.output_token_ids)
        self.driver.release(stream)
        if rec.finish_time is not None:  # the answer leaves when the record says the client has it
            await self.driver.wait_until(rec.finish_time)
        try:
            reason = self._finish_reason(stream)
        except ApiError as err:
            return _error(err)
        ids = list(rec.output_token_ids)
        text = self.tok.decode(ids)
        body = self._envelope(req, stream)
        if req.kind == "chat":
            message = {"role": "assistant", "content": text}
            body["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": reason}]
        else:
            body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]
        body["usage"] = usage(len(req.prompt_ids), len(ids))
        return web.json_response(body)

    def _envelope(self, req: ServeRequest, stream: Stream, chunk: bool = False) -> dict:
        kind = "chat.completion" if req.kind == "chat" else "text_completion"
        return {
            "id": stream.request_id,
            "object": kind + (".chunk" if chunk and req.kind == "chat" else ""),
            "created": self.created,
            "model": self.model,
        }

    def _chunk(self, req: ServeRequest, stream: Stream, text: str | None, reason: str | None, first: bool) -> dict:
        body = self._envelope(req, stream, chunk=True)
        if req.kind == "chat":
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
        else:
            body["choices"] = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}]
        if req.include_usage:
            body["usage"] = None
        return body

    async def _stream(self, request: web.Request, req: ServeRequest, stream: Stream) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await self._stream_to(request, response, req, stream)
        except ConnectionResetError:  # a write to a client that closed (aiohttp: ClientConnectionResetError)
            stream.client_gone = True
        return response

    async def _stream_to(
        self, request: web.Request, response: web.StreamResponse, req: ServeRequest, stream: Stream
    ) -> None:
        await response.prepare(request)

        async def send(obj: dict | str) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
            await response.write(f"data: {data}\n\n".encode())

        rec = stream.record
        any_text = False
        role_sent = req.kind != "chat"
        while True:
            await self._wait(stream)
            end = len(rec.output_token_ids)
            new = rec.output_token_ids[stream.seen : end]
            times = rec.token_times[stream.seen : end]
            for token, t in zip(new, times):
                # A token leaves no earlier than its stamped time (the simulation
                # produces it earlier: the API server's token side is still ahead).
                await self.driver.wait_until(t)
                if not role_sent:
                    # vLLM sends the role with the first output, not before: a client's TTFT starts there.
                    await send(self._chunk(req, stream, "", None, first=True))
                    role_sent = True
                stream.seen += 1
                word = self.tok.token_text(token)
                if word:
                    await send(self._chunk(req, stream, (" " if any_text else "") + word, None, first=False))
                    any_text = True
            if rec.finish_reason is not None and stream.seen == len(rec.output_token_ids):
                break
        self.driver.release(stream)  # done in the engine: counted before the client hears the end
        if rec.finish_time is not None:  # the finish rides the last token, or comes later
            await self.driver.wait_until(rec.finish_time)
        if not role_sent:  # no token at all (a request that failed before its first)
            await send(self._chunk(req, stream, "", None, first=True))
        try:
            reason = self._finish_reason(stream)
        except ApiError as err:
            await send(err.body())
            reason = None
        if reason is not None:
            await send(self._chunk(req, stream, None if req.kind == "chat" else "", reason, first=False))
        if req.include_usage:
            last = self._envelope(req, stream, chunk=True)
            last["choices"] = []
            last["usage"] = usage(len(req.prompt_ids), len(rec.output_token_ids))
            await send(last)
        await send("[DONE]")
        await response.write_eof()
