"""``accelgen warm -- CMD ...``: run CMD (Snakemake) with a warm interpreter serving its short jobs.

The quick pipeline runs about 500 jobs of a second or two; most of each is the interpreter
starting and importing pandas, pyarrow, pydantic and the package. ``accelgen warm`` starts one
server process that imports all of it once, and runs CMD with the pipeline's interpreter
(``$ACCELGEN_PYTHON``, rules/common.smk) pointed at a shim (``warm_client``): a simulation,
trace, workload or aggregation job is then a fork of the server, with the job's own standard
streams, working directory, environment and arguments; every other job (the real engine,
notebooks) runs the real interpreter as before. Results are the same files: the job runs the same
code on the same inputs, in a process that has imported what it would import.

A job's benchmark file (Snakemake's ``benchmark:``) then times the shim: its wall time is the
job's, its CPU time and memory are not (the fork is not the shim's child). ``--jobs-log FILE``
appends one JSON line per forked job with what the fork itself used (its arguments and working
directory, exit status, wall and CPU seconds, peak RSS): the CPU time of the pipeline's
simulations under ``accelgen warm`` (``scripts/paper_scaled.sh`` compares it with the runtime
estimate's ``--warm`` prices).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import resource
import runpy
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from accelgen.cli import warm_client
from accelgen.cli.warm_client import HEADER, PYTHON_ENV, SOCKET_ENV, STREAMS

# Read by rules/common.smk: the interpreter the pipeline's jobs run.
PIPELINE_PYTHON_ENV = "ACCELGEN_WARM_PYTHON"
# What the server imports before it forks: what the warm jobs import.
PRELOAD = ("numpy", "pandas", "pyarrow.parquet", "yaml", "pydantic", "numba", "tqdm",
           "accelgen.cli", "accelgen.cli.simulate", "accelgen.cli.oracle", "accelgen.cli.trace",
           "accelgen.pipeline.aggregate", "accelgen.pipeline.config_file",
           "accelgen.pipeline.scenarios", "accelgen.policies.registry", "accelgen.sim.runner",
           "accelgen.results", "accelgen.workloads")
# Read when a library is imported: a job whose values differ runs the real interpreter.
IMPORT_TIME_ENV = ("PYTHONPATH", "PYTHONHASHSEED", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                   "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMBA_NUM_THREADS",
                   "NUMBA_DISABLE_JIT", "NUMBA_CACHE_DIR", "ACCELGEN_DECISION")
# The server imports with the thread settings Snakemake gives a one-thread job.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "GOTO_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1"}
READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0  # how long a stopping server waits for jobs still running


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "warm", help="run a command (Snakemake) with a warm interpreter for its short jobs",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs-log", type=Path, metavar="FILE",
                   help="append one JSON line per forked job: argv, cwd, exit, wall_s, cpu_s, "
                        "max_rss_mb")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the command and its arguments (after --)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        raise ValueError("no command given (accelgen warm -- snakemake ...)")
    counts: dict[str, int] = {}
    jobs_log = args.jobs_log.resolve() if args.jobs_log else None
    if jobs_log:
        jobs_log.parent.mkdir(parents=True, exist_ok=True)
    with serving(counts, jobs_log) as env:
        proc = subprocess.Popen(cmd, env=env)
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # the command has it too (same process group): wait
                continue
    print(f"accelgen warm: {shlex.join(cmd)} exited with {code}; jobs run warm: "
          f"{counts.get('forked', 0)}, handed back to the interpreter: "
          f"{counts.get('declined', 0)}" + (f"; jobs log: {jobs_log}" if jobs_log else ""))
    return code


@contextlib.contextmanager
def serving(counts: dict[str, int] | None = None,
            jobs_log: Path | None = None) -> Iterator[dict[str, str]]:
    """A warm server for the time of the block; yields the environment a command runs in for
    its jobs to use it. ``counts``: filled at the end with the jobs forked and declined;
    ``jobs_log``: the file each forked job appends its line to."""
    with tempfile.TemporaryDirectory(prefix="accelgen-warm-") as tmp:
        path = Path(tmp) / "socket"
        shim = Path(tmp) / "python"
        env = {**os.environ, **ONE_THREAD}
        server = subprocess.Popen([sys.executable, "-m", "accelgen.cli.warm", str(path),
                                   *([str(jobs_log)] if jobs_log else [])],
                                  env=env, stdin=subprocess.DEVNULL)
        try:
            try:
                _wait_ready(path, server)
            except RuntimeError as exc:  # the jobs run as without `accelgen warm`
                print(f"{exc}; the jobs start their own interpreters", file=sys.stderr)
                yield dict(os.environ)
                return
            client = Path(warm_client.__file__).resolve()
            shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -S -P "
                            f"{shlex.quote(str(client))} \"$@\"\n")
            shim.chmod(0o700)
            yield {**os.environ, SOCKET_ENV: str(path), PYTHON_ENV: sys.executable,
                   PIPELINE_PYTHON_ENV: str(shim)}
        finally:
            server.terminate()
            server.wait()
            tally = Path(f"{path}.counts")
            if counts is not None and tally.exists():
                counts.update(json.loads(tally.read_text()))


def _wait_ready(path: Path, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not path.exists():
        if server.poll() is not None:
            raise RuntimeError(f"accelgen warm: the server exited with {server.returncode}")
        if time.monotonic() > deadline:
            server.terminate()
            raise RuntimeError(f"accelgen warm: the server not ready in {READY_TIMEOUT_S:g} s")
        time.sleep(0.05)


# -- the server -------------------------------------------------------------------------------
def serve(path: str, jobs_log: str | None = None) -> None:
    """Import what the jobs import, then fork one process per job handed over on ``path``
    (each appends its line to ``jobs_log``, when given)."""
    for module in PRELOAD:
        importlib.import_module(module)
    from accelgen.policies.accelgen import build

    build.load()  # AccelGen's compiled decision, loaded (or compiled) once for every job
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path + ".tmp"
    listener.bind(tmp)
    os.chmod(tmp, 0o600)
    listener.listen(64)
    os.rename(tmp, path)  # ready: the path appears once it accepts
    # Jobs are reaped here (not by the kernel, SIG_IGN): their CPU time then adds to the
    # server's children's, and so to what `time accelgen warm -- ...` reports.
    signal.signal(signal.SIGCHLD, _reap)
    counts = {"forked": 0, "declined": 0}

    def stop(_signum: int, _frame: object) -> None:
        Path(f"{path}.counts").write_text(json.dumps(counts))
        # Jobs still running (none once Snakemake has ended): reaped as they end, for a while.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        deadline = time.monotonic() + STOP_GRACE_S
        with contextlib.suppress(ChildProcessError):
            while time.monotonic() < deadline:
                if not os.waitpid(-1, os.WNOHANG)[0]:
                    time.sleep(0.05)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        conn, _ = listener.accept()
        fds: list[int] = []
        try:
            request, fds = _receive(conn)
            reason = _declined(request)
            if reason:
                counts["declined"] += 1
                _send(conn, {"declined": reason})
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _run_job(conn, request, fds, jobs_log)  # never returns
            counts["forked"] += 1
        except (OSError, ValueError):
            pass
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()


def _reap(_signum: int, _frame: object) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, len(STREAMS))
    buf = bytearray(data)
    if len(fds) != len(STREAMS) or len(buf) < HEADER.size:
        raise ValueError("a request without its streams")
    (size,) = HEADER.unpack_from(buf)
    while len(buf) < HEADER.size + size:
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("a request cut short")
        buf += chunk
    return json.loads(buf[HEADER.size:HEADER.size + size]), list(fds)


def _declined(request: dict) -> str:
    env = request.get("env", {})
    if not warm_client.warm_job(list(request.get("argv", []))):
        return "not a warm job"
    differ = [k for k in IMPORT_TIME_ENV if env.get(k) != os.environ.get(k)]
    return f"{', '.join(differ)} differ from the server's" if differ else ""


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _run_job(conn: socket.socket, request: dict, fds: list[int], jobs_log: str | None) -> None:
    code = 1
    start = time.monotonic()
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the job may wait for its own children
        for fd, stream in zip(fds, STREAMS, strict=True):
            os.dup2(fd, stream)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _, module, *args = request["argv"]
        sys.argv = [module, *args]
        _send(conn, {"pid": os.getpid()})
        code = _run_module(module)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        if jobs_log:
            with contextlib.suppress(OSError):
                _log_job(jobs_log, request, code, time.monotonic() - start)
        with contextlib.suppress(OSError):
            _send(conn, {"exit": code})
        os._exit(code)


def _log_job(jobs_log: str, request: dict, code: int, wall_s: float) -> None:
    """Append the job's line: a fork starts with its CPU counters at zero (fork(2)), so its own
    usage plus its waited-for children's is the job's."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    line = json.dumps({"argv": request["argv"], "cwd": request["cwd"], "exit": code,
                       "wall_s": round(wall_s, 4),
                       "cpu_s": round(own.ru_utime + own.ru_stime + kids.ru_utime
                                      + kids.ru_stime, 4),
                       "max_rss_mb": round(max(own.ru_maxrss, kids.ru_maxrss) / 1024, 1)})
    # One write of a line under O_APPEND: lines of jobs ending together do not interleave.
    fd = os.open(jobs_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _run_module(module: str) -> int:
    """``python -m module``'s exit status."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # reported as the interpreter reports it
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
