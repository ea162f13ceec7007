"""A small HTTP file server on 127.0.0.1 for download tests, and dataset files in the real formats.

``FileServer`` serves byte strings by path with what the downloader relies on from real hosts:
``Range`` requests (206 + ``Content-Range``), a strong ``ETag`` honoured by ``If-Range``, and
redirects (Hugging Face's ``resolve`` URLs redirect to a CDN). It can also cut a response short
(``drop``) to imitate a dropped connection, and it records every request. It listens on port 0
(a free port), each request is bounded by a socket timeout, and ``stop`` (or leaving the ``with``
block) shuts it down.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

WORDS = (
    "the", "model", "serves", "requests", "with", "tight", "deadlines", "while", "the", "cache",
    "fills", "and", "every", "token", "counts", "a", "scheduler", "decides", "which", "prompt",
    "runs", "next", "under", "its", "budget", "of", "time", "and", "memory", "quickly", "slowly",
    "again", "never", "always", "because",
)


@dataclass
class Request:
    path: str
    range: str | None
    if_range: str | None


@dataclass
class FileServer:
    files: dict[str, bytes] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)  # path -> path
    drops: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (times, after bytes)
    down: set[str] = field(default_factory=set)  # paths answered 503 (the host is down)
    down_after_drop: set[str] = field(default_factory=set)  # go down once the drops are spent
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # seconds a request may stall: the server's loops are bounded

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                server._get(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FileServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def gets(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == "/" + path.lstrip("/")]

    # ------------------------------------------------------------------ serving
    def _get(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path
        self.requests.append(Request(path, h.headers.get("Range"), h.headers.get("If-Range")))
        key = path.lstrip("/")
        if key in self.redirects:
            h.send_response(302)
            h.send_header("Location", self.url(self.redirects[key]))
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if key in self.down:
            h.send_error(503, "Service Unavailable")
            return
        if key not in self.files:
            h.send_error(404, "Not Found")
            return
        body = self.files[key]
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        start = 0
        rng = h.headers.get("Range")
        if rng and (h.headers.get("If-Range") in (None, etag)):
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(body)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            h.send_response(200)
        part = body[start:]
        h.send_header("Content-Length", str(len(part)))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("ETag", etag)
        h.end_headers()
        times, after = self.drops.get(key, (0, 0))
        if times > 0:
            self.drops[key] = (times - 1, after)
            if times == 1 and key in self.down_after_drop:
                self.down.add(key)
            h.wfile.write(part[:after])  # then the connection closes: a dropped download
            h.wfile.flush()
            h.close_connection = True
            return
        h.wfile.write(part)


# --------------------------------------------------------------------------------------------
# small files in the real formats


def _text(rng: np.random.Generator, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi))))


def alpaca_json(n: int, seed: int = 0) -> bytes:
    """``alpaca_data.json``: a JSON list of {instruction, input, output} (input often empty)."""
    rng = np.random.default_rng(seed)
    rows = [{"instruction": _text(rng, 4, 30),
             "input": _text(rng, 3, 40) if rng.random() < 0.4 else "",
             "output": _text(rng, 5, 120)} for _ in range(n)]
    return json.dumps(rows, indent=4).encode()


def sharegpt_json(n: int, seed: int = 1) -> bytes:
    """``ShareGPT_V3_unfiltered_cleaned_split.json``: {id, conversations: [{from, value}...]},
    with some one-turn conversations (not requests) as in the real dump."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        turns = [{"from": "human" if t % 2 == 0 else "gpt", "value": _text(rng, 5, 300)}
                 for t in range(int(rng.integers(1, 5)))]
        rows.append({"id": f"conv{i}", "conversations": turns})
    return json.dumps(rows).encode()


def bookcorpus_parquet(n: int, seed: int = 2) -> bytes:
    """A BookCorpus parquet shard as the Hugging Face conversion writes it: one ``text`` column
    of sentences."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    table = pa.table({"text": [_text(rng, 3, 25) + " ." for _ in range(n)]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def dataset_files(scale: int = 1) -> dict[str, bytes]:
    """The three files under their real names (``accelgen.workloads.datasets.CATALOGUE``)."""
    from accelgen.workloads.datasets import CATALOGUE

    blobs = {"alpaca": alpaca_json(60 * scale), "sharegpt": sharegpt_json(40 * scale),
             "bookcorpus": bookcorpus_parquet(400 * scale)}
    return {CATALOGUE[name].file: blob for name, blob in blobs.items()}


def download_section(server: FileServer, raw_dir: str, **extra: object) -> dict[str, object]:
    """A ``download:`` config section fetching every dataset from ``server``."""
    from accelgen.workloads.datasets import CATALOGUE

    return {"dir": raw_dir, "datasets": {n: {"url": server.url(d.file)}
                                         for n, d in CATALOGUE.items()}, **extra}
