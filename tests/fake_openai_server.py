"""A deterministic fake of vLLM's streaming completions endpoint, for comparing serving clients
(``test_bench_clients.py``, ``scripts/compare_clients.py --url``): ``python
tests/fake_openai_server.py PORT`` serves ``POST /v1/completions`` (streamed), ``GET /v1/models``
and ``GET /health`` on 127.0.0.1.

Each request gets its first event ``FIRST_S + PER_PROMPT_TOKEN_S x prompt tokens`` after it
arrived, then one event every ``GAP_S`` until ``max_tokens`` tokens are sent; every fifth event
carries two tokens (a stream that fell behind its engine). Events carry ``token_ids`` when asked
(``return_token_ids``) and a running usage with ``continuous_usage_stats``; a final event has the
usage, then ``[DONE]``. Each token's text is `` the`` (one token of GPT-2 and of the tiny
model's tokenizer), so a client that re-tokenizes the reply counts what was sent. The times
are coarse enough that a loaded machine's few milliseconds of
scheduling jitter stay well below the 10 % the clients are compared to.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from aiohttp import web

FIRST_S = 0.100
PER_PROMPT_TOKEN_S = 0.0002
GAP_S = 0.040
PACK_EVERY = 5


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    n = int(body["max_tokens"])
    prompt = body["prompt"]
    ids = body.get("return_token_ids", False)
    usage_each = (body.get("stream_options") or {}).get("continuous_usage_stats", False)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await asyncio.sleep(FIRST_S + PER_PROMPT_TOKEN_S * len(prompt))
    sent, event = 0, 0
    while sent < n:
        k = min(2 if event % PACK_EVERY == PACK_EVERY - 1 else 1, n - sent)
        sent += k
        choice: dict[str, Any] = {"index": 0, "text": " the" * k,
                                  "finish_reason": "length" if sent == n else None}
        if ids:
            choice["token_ids"] = [7] * k
        chunk: dict[str, Any] = {"id": "cmpl-fake", "object": "text_completion",
                                 "model": body.get("model", "fake"), "choices": [choice]}
        if usage_each:
            chunk["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": sent}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        event += 1
        if sent < n:
            await asyncio.sleep(GAP_S)
    usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": n}
    await resp.write(b"data: " + json.dumps({"id": "cmpl-fake", "object": "text_completion",
                                             "choices": [], "usage": usage}).encode()
                     + b"\n\ndata: [DONE]\n\n")
    return resp


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


if __name__ == "__main__":
    web.run_app(make_app(), host="127.0.0.1", port=int(sys.argv[1]), print=None)
