"""SLOs over HTTP: an ASGI middleware for vLLM's OpenAI-compatible server.

Load it with ``--middleware accelgen.vllm_integration.slo_http.SLOMiddleware`` (``accelgen
serve`` does). For every POST with a JSON body it checks the request's SLO fields before vLLM
parses the request, with the plugin's own rule (``config.parse_request_slo``), so a bad value is
an HTTP 400 naming the field and value instead of an error inside the engine (which vLLM's
server reports as a bare 500 "Internal server error"). SLOs arrive

- in the body's ``vllm_xargs`` (vLLM's extension field, passed to the engine as
  ``SamplingParams.extra_args``): ``{"vllm_xargs": {"ttft_slo": 0.5, "tbt_slo": 0.05}}``;
- or in the header ``X-AccelGen-SLO: ttft_slo=0.5, tbt_slo=0.05`` (comma-separated
  ``key=value`` pairs, values JSON or float literals), which the middleware copies into the
  body's ``vllm_xargs``; a key given in both with different values is refused.

A request whose ``req_id`` was already served by this server (a 2xx response) is refused too:
the plugin's records key requests by it. (The engine refuses duplicates as well; its refusal is
what another API server process sees with ``--api-server-count`` > 1.)

Once the server has begun to stop (SIGTERM; ``api_server``, the process ``accelgen serve``
runs), every POST is answered 503 ``{"error": {"message": SHUTTING_DOWN_MESSAGE, "type":
"ServiceUnavailableError", "code": 503}}`` with ``connection: close``, before vLLM sees it: the
request is not served and not in the plugin's logs. 503 is what vLLM answers when its queue is
full, so clients and load balancers retry it elsewhere; ``is_shutdown_refusal`` tells it apart
from a server fault.

Requests without SLOs get the plugin's configured defaults in the engine. Refusals look like
vLLM's own errors: ``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``.

A token-id prompt with an id outside the model's vocabulary is refused here too, naming
``prompt`` (vLLM refuses it with ``param: null``).

A server started with ``--skip-tokenizer-init`` cannot render a chat; vLLM 0.32 answers a chat
completion there with a bare 500 (an ``assert`` in its chat handler). The middleware answers 400
instead, naming ``messages`` (``input`` for the Responses API), and points to token-id prompts;
it reads the setting from the app's ``state.vllm_config``, which vLLM's server sets.

A request naming a model the server does not serve gets vLLM's own 404 (``param: model``), with
its message ending in the names the server answers to (``GET /v1/models``; LoRA adapters
included): vLLM lists them itself, but its error filter turns a name that is a file path (a
model served under its directory's name) into ``<path>``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from accelgen.vllm_integration.adapter_config import (
    REQUEST_KEYS,
    SLODefaults,
    SLOError,
    parse_request_slo,
)
from accelgen.vllm_integration.api_server import ShutdownState, shutdown_state

SLO_HEADER = "x-accelgen-slo"
# The answer to a request that arrives once the server has begun to stop (``shutdown``): 503,
# as vLLM answers a full queue, so that clients and load balancers send it elsewhere.
SHUTTING_DOWN_STATUS = 503
SHUTTING_DOWN_TYPE = "ServiceUnavailableError"
SHUTTING_DOWN_MESSAGE = ("the server is shutting down (it received SIGTERM) and takes no new "
                         "requests; send this one to another server")
XARGS = "vllm_xargs"
# Endpoints that need the tokenizer (a chat template) -> the field that needs it.
TOKENIZER_PATHS = {"/v1/chat/completions": "messages", "/v1/responses": "input"}

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BadSLORequest(ValueError):
    """A request the middleware refuses: ``param`` is the field, the message says why."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def parse_slo_header(value: str) -> dict[str, Any]:
    """``"ttft_slo=0.5, tbt_slo=0.05"`` -> ``{"ttft_slo": 0.5, "tbt_slo": 0.05}``; values are
    JSON (``true``, ``"x"``, ``1e3``) or float literals (``inf``, ``nan``); anything else stays a
    string, which the SLO rule then refuses with the field's name."""
    out: dict[str, Any] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise BadSLORequest(f"X-AccelGen-SLO: {item.strip()!r} is not key=value", "header")
        if key not in REQUEST_KEYS:
            raise BadSLORequest(f"X-AccelGen-SLO: unknown key {key!r} (known: "
                                f"{', '.join(REQUEST_KEYS)})", f"header.{key}")
        if key in out:
            raise BadSLORequest(f"X-AccelGen-SLO: {key} given twice", f"header.{key}")
        out[key] = _header_value(raw)
    return out


def _header_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))


def check_request(body: dict[str, Any], header: str | None) -> tuple[dict[str, Any], bool]:
    """Check one request body's SLO fields (merging the header's); returns the body to forward
    and whether it changed. Raises ``BadSLORequest``."""
    changed = False
    xargs = body.get(XARGS)
    if header is not None:
        extra = parse_slo_header(header)
        if extra:
            if xargs is None:
                xargs = {}
            elif not isinstance(xargs, dict):
                raise BadSLORequest(f"{XARGS} must be an object to merge the X-AccelGen-SLO "
                                    "header into it", XARGS)
            for key, value in extra.items():
                if key in xargs and not _same(xargs[key], value):
                    raise BadSLORequest(f"{key} is given both in the X-AccelGen-SLO header "
                                        f"({value!r}) and in {XARGS} ({xargs[key]!r})",
                                        f"{XARGS}.{key}")
            body = {**body, XARGS: {**xargs, **extra}}
            xargs = body[XARGS]
            changed = True
    if isinstance(xargs, dict):
        try:
            # Only validity matters here: the engine applies its configured defaults itself.
            parse_request_slo(xargs, SLODefaults())
        except SLOError as exc:
            raise BadSLORequest(f"invalid {XARGS}: {exc}", f"{XARGS}.{exc.fields[0]}") from None
    # Anything else (no vllm_xargs, or not an object) is vLLM's to judge.
    return body, changed


class SLOMiddleware:
    """Pure ASGI middleware (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.served_req_ids: set[int] = set()
        self.vocab_size: int | None = None  # the model's, read from the app on first use

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        stopping = shutdown_state(scope.get("app"))
        if stopping is not None and stopping.began is not None:
            await _refuse_shutting_down(send, stopping)
            return
        send = _naming_models(send, scope)
        field = TOKENIZER_PATHS.get(str(scope.get("path", "")).rstrip("/"))
        if field is not None and skips_tokenizer(scope):
            await _send_error(send, f"this server runs without a tokenizer "
                              f"(--skip-tokenizer-init), so it cannot read '{field}': send "
                              "token ids as the prompt of /v1/completions", field)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        header = _header(headers, SLO_HEADER.encode())
        ctype = _header(headers, b"content-type") or ""
        if header is None and "json" not in ctype.lower():
            await self.app(scope, receive, send)
            return
        body, disconnected = await _read_body(receive)
        if disconnected:
            return
        if stopping is not None and stopping.began is not None:  # (while the body came in)
            await _refuse_shutting_down(send, stopping)
            return
        req_id: Any = None
        if header is not None or XARGS.encode() in body or b'"prompt"' in body:
            try:
                data = json.loads(body)
            except ValueError:
                data = None  # vLLM reports malformed JSON itself
            if isinstance(data, dict):
                try:
                    check_token_ids(data.get("prompt"), self._vocab_size(scope))
                    data, changed = check_request(data, header)
                    xargs = data.get(XARGS)
                    req_id = xargs.get("req_id") if isinstance(xargs, dict) else None
                    if req_id is not None and req_id in self.served_req_ids:
                        raise BadSLORequest(f"invalid {XARGS}: req_id={req_id} was already "
                                            "served by this server (req_id must be unique)",
                                            f"{XARGS}.req_id")
                except BadSLORequest as exc:
                    await _send_error(send, str(exc), exc.param)
                    return
                if changed:
                    body = json.dumps(data).encode()
                    headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                    headers.append((b"content-length", str(len(body)).encode()))
                    scope = {**scope, "headers": headers}
        await self.app(scope, _replay(body, receive), self._recording(send, req_id))

    def _vocab_size(self, scope: Scope) -> int | None:
        if self.vocab_size is None:
            model_config = _model_config(scope)
            try:
                self.vocab_size = int(model_config.get_vocab_size())
            except (AttributeError, TypeError, ValueError):
                return None
        return self.vocab_size

    def _recording(self, send: Send, req_id: Any) -> Send:
        if req_id is None:
            return send

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start" and message.get("status", 500) < 400:
                self.served_req_ids.add(req_id)
            await send(message)

        return wrapped


NOT_FOUND = 404


def is_shutdown_refusal(status: int, body: str | bytes) -> bool:
    """Whether an HTTP answer is the middleware's refusal of a request that arrived while the
    server was stopping (not a server fault)."""
    if status != SHUTTING_DOWN_STATUS:
        return False
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(err, dict) and err.get("type") == SHUTTING_DOWN_TYPE


def served_model_names(scope: Scope) -> list[str]:
    """The names this server answers to (its ``state.openai_serving_models``: base models, then
    LoRA adapters), or [] where the app has none."""
    models = getattr(getattr(scope.get("app"), "state", None), "openai_serving_models", None)
    names = [str(getattr(m, "name", "")) for m in getattr(models, "base_model_paths", None) or []]
    names += [str(n) for n in (getattr(models, "lora_requests", None) or {})]
    return [n for n in names if n]


def _naming_models(send: Send, scope: Scope) -> Send:
    """``send`` that rewrites the message of vLLM's "model does not exist" 404 to end with the
    served names; every other response passes through as it comes."""
    held: list[Message] = []

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start" and message.get("status") == NOT_FOUND:
            held.append(message)
            return
        if not held:
            await send(message)
            return
        held.append(message)
        if message.get("more_body", False):
            return
        body = b"".join(m.get("body", b"") for m in held[1:])
        start = held[0]
        new = _name_models(body, served_model_names(scope))
        if new is not None:
            body = new
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            start = {**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        held.clear()
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return wrapped


def _name_models(body: bytes, names: list[str]) -> bytes | None:
    """The 404 body with its message naming ``names``, or None to leave it as it is."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    err = data.get("error") if isinstance(data, dict) else None
    if not names or not isinstance(err, dict) or err.get("param") != "model":
        return None
    message = str(err.get("message", ""))
    first = message.split(" Valid aliases:", 1)[0].rstrip()
    err = {**err, "message": f"{first} This server serves: {', '.join(names)} "
                             "(GET /v1/models lists them)."}
    return json.dumps({**data, "error": err}).encode()


def _model_config(scope: Scope) -> Any:
    """vLLM's ``ModelConfig`` of the server behind this request (the app state vLLM's server
    sets), or None."""
    state = getattr(scope.get("app"), "state", None)
    return getattr(getattr(state, "vllm_config", None), "model_config", None)


def skips_tokenizer(scope: Scope) -> bool:
    """Whether the server runs without a tokenizer (``skip_tokenizer_init``)."""
    return getattr(_model_config(scope), "skip_tokenizer_init", False) is True


def check_token_ids(prompt: Any, vocab_size: int | None) -> None:
    """A token-id prompt (ids, or a batch of id lists) must stay inside the model's vocabulary;
    vLLM refuses such a prompt too, but without naming the field. Other shapes are vLLM's."""
    if vocab_size is None or not isinstance(prompt, list) or not prompt:
        return
    rows = prompt if isinstance(prompt[0], list) else [prompt]
    for j, row in enumerate(rows):
        if not isinstance(row, list):
            return
        for i, token in enumerate(row):
            if isinstance(token, int) and not isinstance(token, bool) and token >= vocab_size:
                where = f"prompt[{j}][{i}]" if rows is prompt else f"prompt[{i}]"
                raise BadSLORequest(f"{where}: token id {token} is outside the model's "
                                    f"vocabulary [0, {vocab_size})", "prompt")


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts), False


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the (possibly rewritten) body once, then the client's own
    messages (vLLM watches them for a disconnect while it streams)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_error(send: Send, message: str, param: str | None) -> None:
    payload = json.dumps({"error": {"message": message, "type": "BadRequestError",
                                    "param": param, "code": 400}}).encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def _refuse_shutting_down(send: Send, state: ShutdownState) -> None:
    state.refused += 1
    payload = json.dumps({"error": {"message": SHUTTING_DOWN_MESSAGE, "type": SHUTTING_DOWN_TYPE,
                                    "param": None, "code": SHUTTING_DOWN_STATUS}}).encode()
    # connection: close, so that the client's keep-alive connection does not hold the server.
    await send({"type": "http.response.start", "status": SHUTTING_DOWN_STATUS,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})
