"""Serving benchmarks over HTTP: ``accelgen bench-serve`` replays a trace, or a random request
set (``datasets``, as ``vllm bench serve`` makes them), against any OpenAI-compatible server
(``bench``) and writes the results files of ``simulate`` and
``replay``, so a served run reads like a simulated one. Needs ``aiohttp`` (the ``serve`` extra),
never vLLM."""
