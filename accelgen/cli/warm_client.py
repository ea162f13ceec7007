"""The job side of ``accelgen warm``: stands in for the Python interpreter of a pipeline job.

``accelgen warm`` points the pipeline's jobs (``$ACCELGEN_PYTHON``, rules/common.smk) at a shim
that runs this file with ``python -S`` (no site-packages: it imports the standard library only, so
it starts in milliseconds). A short job (``-m accelgen.cli simulate ...`` and the others in
``WARM_JOBS``) is handed to the warm server with this process's standard streams, working
directory and environment; a fork of the server, which has the package imported already, runs
it, and this process forwards signals to it and exits with its exit status. Anything else, or
any failure to reach the server, runs the real interpreter in this process's place (``execv``),
exactly as without ``accelgen warm``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import NoReturn

SOCKET_ENV = "ACCELGEN_WARM_SOCKET"  # the server's Unix socket
PYTHON_ENV = "ACCELGEN_WARM_REAL_PYTHON"  # the interpreter to run when the server does not
# (module, sub-command) of the jobs a fork of the server runs: the pipeline's many short
# single-threaded jobs (not the real engine's, which start their own processes and threads).
WARM_JOBS = frozenset({
    ("accelgen.cli", "simulate"), ("accelgen.cli", "oracle"), ("accelgen.cli", "trace"),
    ("accelgen.pipeline", "write-yaml"), ("accelgen.pipeline", "scenario"),
    ("accelgen.pipeline", "aggregate"),
})
HEADER = struct.Struct("!I")  # the length of the request's JSON
STREAMS = (0, 1, 2)


def warm_job(argv: list[str]) -> bool:
    """Whether the interpreter arguments ``argv`` name a job the warm server runs."""
    return len(argv) >= 3 and argv[0] == "-m" and (argv[1], argv[2]) in WARM_JOBS


def _exec_real(argv: list[str]) -> NoReturn:
    python = os.environ.get(PYTHON_ENV) or sys.executable
    os.execv(python, [python, *argv])


def _read_line(conn: socket.socket, buf: bytearray) -> dict | None:
    while b"\n" not in buf:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


def main(argv: list[str]) -> int:
    path = os.environ.get(SOCKET_ENV)
    if not path or not warm_job(argv):
        _exec_real(argv)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        body = json.dumps({"argv": argv, "cwd": os.getcwd(),
                           "env": dict(os.environ)}).encode()
        socket.send_fds(conn, [HEADER.pack(len(body)) + body], list(STREAMS))
        buf = bytearray()
        first = _read_line(conn, buf)
    except OSError:
        first = None
    if first is None or "pid" not in first:
        # Declined (e.g. the job's thread settings differ from the server's) or unreachable.
        conn.close()
        _exec_real(argv)
    pid = int(first["pid"])

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, forward)
    last = _read_line(conn, buf)  # (a forwarded signal does not interrupt it: PEP 475)
    if last is None or "exit" not in last:
        print(f"accelgen warm: job {pid} ended without an exit status (killed?)",
              file=sys.stderr)
        return 1
    return int(last["exit"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
