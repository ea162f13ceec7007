"""The process ``accelgen serve`` runs: vLLM's OpenAI-compatible API server
(``vllm.entrypoints.openai.api_server``, its own ``main`` and options) with a shutdown that ends
in bounded time.

vLLM 0.32's server, on SIGTERM, drains its engine (up to ``--shutdown-timeout``) while uvicorn
still accepts requests, then stops uvicorn, which waits without limit for every connection to
close: a stream accepted while the engine was stopping, or after it stopped, gets no output and
never ends, so the process never exits. Here, from the moment vLLM's signal handler starts the
shutdown (it calls the engine client's ``shutdown``):

1. every POST is refused with 503 and a message saying the server is stopping
   (``slo_http.SLOMiddleware``, ``slo_http.SHUTTING_DOWN_*``); its connection is closed;
2. streams in flight go on while the engine drains; the plugin's scheduler ends the requests it
   still holds ``shutdown_grace_s`` after SIGTERM (``scheduler.InstrumentedScheduler``: their
   clients get finish reason ``abort``, the log says ``logsink.SHUTDOWN_REASON``), so the engine
   core stops and writes its logs before vLLM's ``--shutdown-timeout`` would kill it;
3. once the engine client has stopped, or its output handler has seen the engine core exit,
   every request the API server still tracks gets its final output (finish reason ``abort``:
   vLLM's own abort, not the engine's death as an error), which ends its stream; so does a
   request accepted before SIGTERM that reaches the engine client only after that;
4. uvicorn then waits at most ``HTTP_CLOSE_TIMEOUT_S`` for connections to close
   (``timeout_graceful_shutdown``) and cancels what is left.

Run as ``python -m accelgen.vllm_integration.api_server <vLLM's server options>``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("vllm.accelgen")

# Seconds uvicorn waits for open connections once the engine has stopped (step 4).
HTTP_CLOSE_TIMEOUT_S = 5.0
STATE_ATTR = "accelgen_shutdown"  # the app.state attribute holding the ShutdownState


@dataclass(slots=True)
class ShutdownState:
    """When the server began to stop (epoch seconds), read by the middleware."""

    began: float | None = None
    refused: int = 0  # POSTs answered 503 since
    streams_ended: int = 0  # requests given their final output after the engine stopped
    engine_stopped: bool = False  # the engine client's shutdown has returned


def shutdown_state(app: Any) -> ShutdownState | None:
    """The app's ``ShutdownState`` (None for a server not started by this module)."""
    state = getattr(getattr(app, "state", None), STATE_ATTR, None)
    return state if isinstance(state, ShutdownState) else None


def end_tracked_requests(engine_client: Any) -> int:
    """Give every request the API server's engine client still tracks its final output
    (finish reason ``abort``), which ends its stream; returns how many. Runs on the event
    loop (the outputs' queues are asyncio ones)."""
    processor: Any = getattr(engine_client, "output_processor", None)
    states = getattr(processor, "request_states", None)
    if processor is None or not states:
        return 0
    ids = list(states)
    processor.abort_requests(ids, internal=True)
    return len(ids)


def install(app: Any, loop: Any) -> ShutdownState:
    """Hook the shutdown of the app's engine client (steps 1 and 3 of the module docstring)."""
    state = ShutdownState()
    setattr(app.state, STATE_ATTR, state)
    engine_client = getattr(app.state, "engine_client", None)
    if engine_client is None:
        return state
    stop_engine = engine_client.shutdown
    processor: Any = getattr(engine_client, "output_processor", None)
    if processor is not None and hasattr(processor, "propagate_error"):
        propagate_error = processor.propagate_error

        def propagate_unless_stopping(error: Exception) -> None:
            # Once the engine is stopping, its output handler sees the engine core exit as an
            # EngineDeadError and would hand it to every open stream (HTTP 500 in the stream)
            # before step 3 runs; those requests end unfinished instead, like step 3's.
            if state.began is None:
                propagate_error(error)
                return
            n = end_tracked_requests(engine_client)
            state.streams_ended += n
            if n:
                logger.warning("accelgen: %d requests still open when the engine stopped end "
                               "unfinished (finish reason abort)", n)

        processor.propagate_error = propagate_unless_stopping
    core: Any = getattr(engine_client, "engine_core", None)
    if processor is not None and core is not None and hasattr(core, "add_request_async"):
        send = core.add_request_async

        async def send_unless_stopped(request: Any, *args: Any, **kwargs: Any) -> Any:
            # A request the API server registered (vLLM does so before it sends it to the
            # engine) after step 3 ran would wait for an output that never comes until uvicorn
            # cuts its connection: it ends unfinished now instead.
            if not state.engine_stopped:
                return await send(request, *args, **kwargs)
            processor.abort_requests([request.request_id], internal=True)
            state.streams_ended += 1
            return None

        core.add_request_async = send_unless_stopped

    def shutdown(*args: Any, **kwargs: Any) -> None:
        # vLLM calls this in an executor thread when SIGTERM arrives (and once more as its
        # engine client's context ends).
        if state.began is None:
            state.began = time.time()
            logger.info("accelgen: shutting down: new requests are refused (503), streams in "
                        "flight end by the plugin's grace period")
        stop_engine(*args, **kwargs)
        state.engine_stopped = True
        done = threading.Event()

        def end_streams() -> None:
            try:
                n = end_tracked_requests(engine_client)
                state.streams_ended += n
                if n:
                    logger.warning("accelgen: %d requests still open after the engine stopped "
                                   "end unfinished (finish reason abort)", n)
            finally:
                done.set()

        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:  # (vLLM's second call, as its engine client's context ends)
            end_streams()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(end_streams)
            done.wait(HTTP_CLOSE_TIMEOUT_S)

    engine_client.shutdown = shutdown
    return state


def main() -> None:
    from vllm.entrypoints.launchers.api_server import entry

    serve_http = entry.serve_http

    async def bounded_serve_http(app: Any, *args: Any, **kwargs: Any) -> Any:
        install(app, asyncio.get_running_loop())
        kwargs.setdefault("timeout_graceful_shutdown", HTTP_CLOSE_TIMEOUT_S)
        return await serve_http(app, *args, **kwargs)

    # entry.build_and_serve looks serve_http up in its module when it starts the server.
    entry.serve_http = bounded_serve_http
    entry.main()


if __name__ == "__main__":
    # Through the imported module, so that the middleware (which imports it) and this server
    # share one ShutdownState class.
    from accelgen.vllm_integration import api_server

    api_server.main()
