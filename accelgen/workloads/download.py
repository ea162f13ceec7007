"""Resumable, atomic, checksummed HTTP downloads of the dataset files (``accelgen download``).

A file is fetched into ``.<name>.part`` beside its destination and renamed into place only when
it is complete and its sha256 is the expected one, so the destination never holds part of a file.
A dropped connection is resumed with an HTTP ``Range`` request (``If-Range`` with the server's
validator, so a file that changed upstream restarts from zero instead of being spliced); an
interrupted command leaves the ``.part`` file for the next run to resume.

Every file's size and sha256 go into ``SHA256SUMS`` in the download directory on first download
(``sha256sum -c SHA256SUMS`` checks them); later runs verify the file against it, and a config
may pin the sha256. A download whose bytes do not match is an error and the file already there
is kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from accelgen import __version__
from accelgen.workloads.datasets import DownloadConfig
from accelgen.workloads.errors import WorkloadError

SUMS_FILE = "SHA256SUMS"
_SUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](\S.*)$")
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
# Transient HTTP statuses worth another attempt; anything else 4xx is the URL's fault.
_RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}


class DownloadError(WorkloadError):
    """A file could not be fetched or verified; the message names the URL and the fix."""


class ChecksumError(DownloadError):
    """Downloaded or present bytes do not have the expected sha256."""


@dataclass(frozen=True, slots=True)
class FileRecord:
    file: str
    size: int
    sha256: str
    url: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    name: str
    path: Path
    record: FileRecord
    action: str  # downloaded | verified | recorded


# --------------------------------------------------------------------------------------------
# SHA256SUMS


def read_sums(directory: Path) -> dict[str, FileRecord]:
    """``{file: record}`` from ``directory/SHA256SUMS`` (empty when there is none)."""
    path = directory / SUMS_FILE
    if not path.exists():
        return {}
    meta: dict[str, dict[str, str]] = {}
    out: dict[str, FileRecord] = {}
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            # "# <file> size=<bytes> url=<url>": the size and source of the line that follows.
            parts = line[1:].split()
            if len(parts) >= 2 and all("=" in p for p in parts[1:]):
                meta[parts[0]] = dict(p.split("=", 1) for p in parts[1:])
            continue
        m = _SUM_LINE.match(line)
        if m is None:
            raise DownloadError(f"{path}: line {i}: expected '<sha256>  <file>', got {line!r}")
        sha, name = m.groups()
        info = meta.get(name, {})
        size = int(info["size"]) if info.get("size", "").isdigit() else -1
        out[name] = FileRecord(name, size, sha, info.get("url"))
    return out


def write_sums(directory: Path, records: dict[str, FileRecord]) -> Path:
    """Write ``SHA256SUMS`` atomically (``sha256sum -c`` format plus size/url comment lines)."""
    path = directory / SUMS_FILE
    lines = ["# accelgen download: size and sha256 of each file here "
             "(`sha256sum -c SHA256SUMS` checks them)"]
    for name in sorted(records):
        r = records[name]
        lines.append(f"# {name} size={r.size}" + (f" url={r.url}" if r.url else ""))
        lines.append(f"{r.sha256}  {name}")
    _atomic_write(path, ("\n".join(lines) + "\n").encode())
    return path


@contextlib.contextmanager
def sums_lock(directory: Path) -> Iterator[None]:
    """Serialise read-modify-write of SHA256SUMS between concurrent downloads (pipeline jobs)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f".{SUMS_FILE}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def file_sha256(path: Path, chunk: int = 1 << 20) -> FileRecord:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
            size += len(block)
    return FileRecord(path.name, size, h.hexdigest())


# --------------------------------------------------------------------------------------------
# one file over HTTP


class _Retry(Exception):
    """An attempt failed in a way another attempt may fix."""


@dataclass(slots=True)
class Fetcher:
    """Downloads one URL to one destination; see the module docstring."""

    retries: int = 5
    timeout_s: float = 60.0
    chunk_bytes: int = 1 << 20
    progress: bool = True
    backoff_s: float = 0.5  # first pause between attempts (doubles, at most 30 s)
    sleep: Callable[[float], None] = time.sleep

    def fetch(self, url: str, dest: Path, expected_sha256: str | None = None,
              label: str | None = None) -> FileRecord:
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f".{dest.name}.part")
        state_path = dest.with_name(f".{dest.name}.part.json")
        state = self._load_state(state_path, url, part)
        failures = 0
        last_error = ""
        while True:
            before = part.stat().st_size if part.exists() else 0
            try:
                self._attempt(url, part, state, state_path, label or dest.name)
                break
            except _Retry as exc:
                last_error = str(exc)
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                # URLError covers refused connections and unknown hosts; OSError a reset or a
                # timeout mid-body; HTTPException a body cut short (IncompleteRead). A host name
                # that does not resolve (offline, no DNS) will not resolve a second later.
                if isinstance(getattr(exc, "reason", None), socket.gaierror):
                    raise DownloadError(f"could not download {url}: {_reason(exc)}") from None
                last_error = _reason(exc)
            grew = (part.stat().st_size if part.exists() else 0) > before
            failures = 0 if grew else failures + 1
            if failures > self.retries:
                raise DownloadError(f"could not download {url}: {last_error}") from None
            self.sleep(min(30.0, self.backoff_s * 2 ** max(failures - 1, 0)))
        got = file_sha256(part)
        if expected_sha256 is not None and got.sha256 != expected_sha256:
            part.unlink(missing_ok=True)
            state_path.unlink(missing_ok=True)
            raise ChecksumError(
                f"{url}: downloaded {got.size} bytes with sha256 {got.sha256}, expected "
                f"{expected_sha256}; nothing was written to {dest}")
        os.replace(part, dest)
        state_path.unlink(missing_ok=True)
        return FileRecord(dest.name, got.size, got.sha256, url)

    @staticmethod
    def _load_state(path: Path, url: str, part: Path) -> dict[str, object]:
        """The partial download's state, if it belongs to this URL (else start afresh)."""
        try:
            state = json.loads(path.read_text())
            if state.get("url") == url and part.exists():
                return dict(state)
        except (OSError, ValueError):
            pass
        part.unlink(missing_ok=True)
        return {"url": url}

    def _attempt(self, url: str, part: Path, state: dict[str, object], state_path: Path,
                 label: str) -> None:
        offset = part.stat().st_size if part.exists() else 0
        headers = {"User-Agent": f"accelgen/{__version__}", "Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            if state.get("validator"):
                headers["If-Range"] = str(state["validator"])
        req = urllib.request.Request(url, headers=headers)
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and offset and state.get("total") == offset:
                return  # the part is already the whole file
            if exc.code == 416:
                part.unlink(missing_ok=True)  # the range is wrong for the file now served
                raise _Retry(f"HTTP 416 at byte {offset}; restarting") from None
            if exc.code in _RETRY_STATUS:
                raise _Retry(f"HTTP {exc.code} {exc.reason}") from None
            part.unlink(missing_ok=True)
            raise DownloadError(f"could not download {url}: HTTP {exc.code} {exc.reason}") \
                from None
        with resp:
            total = self._start(resp, offset, part)
            start = part.stat().st_size if part.exists() else 0
            validator = resp.headers.get("ETag") or resp.headers.get("Last-Modified")
            if validator and validator.startswith("W/"):
                validator = resp.headers.get("Last-Modified")  # weak tags cannot validate ranges
            state.update(validator=validator, total=total)
            state_path.write_text(json.dumps(state))
            bar = _bar(total, start, label, self.progress)
            try:
                with open(part, "ab") as fh:
                    while block := resp.read(self.chunk_bytes):
                        fh.write(block)
                        bar.update(len(block))
            finally:
                bar.close()
        size = part.stat().st_size
        if total is not None and size != total:
            raise _Retry(f"connection closed at byte {size} of {total}")

    @staticmethod
    def _start(resp: http.client.HTTPResponse, offset: int, part: Path) -> int | None:
        """Check how the server answered a (ranged) request; return the file's total size."""
        if offset and resp.status == 206:
            m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
            if m is None or int(m.group(1)) != offset:
                part.unlink(missing_ok=True)
                raise _Retry(f"server answered the range from byte {offset} with "
                             f"Content-Range {resp.headers.get('Content-Range')!r}; restarting")
            return int(m.group(3)) if m.group(3) != "*" else None
        # 200: the whole file (the server ignores ranges, or the file changed since the part).
        part.unlink(missing_ok=True)
        length = resp.headers.get("Content-Length")
        return int(length) if length is not None and length.isdigit() else None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        return f"{type(exc.reason).__name__}: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def _bar(total: int | None, initial: int, label: str, enabled: bool):  # -> tqdm
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024,
                desc=label, disable=not enabled, file=sys.stderr, mininterval=0.5,
                dynamic_ncols=True)


# --------------------------------------------------------------------------------------------
# the datasets of a config


def _fix(name: str, dest: Path) -> str:
    return (f"Offline? Use the built-in mix instead (`workload.kind: synthetic`, no downloads), "
            f"put the file at {dest} yourself (it is then recorded in {SUMS_FILE}), point "
            f"`download.datasets.{name}.url` at a mirror, or give `workload.path` a local file.")


def ensure(cfg: DownloadConfig, names: Sequence[str] | None = None, *, force: bool = False,
           progress: bool = True, fetcher: Fetcher | None = None) -> list[Outcome]:
    """Make every named dataset (default: all) present and verified under ``cfg.dir``.

    A file already there is checked against its pinned or recorded sha256 (``force``: fetched
    again, and replaced only if the new bytes have that sha256); a missing file is downloaded.
    A file with no sha256 yet gets one recorded in SHA256SUMS.
    """
    names = list(names) if names else list(cfg.datasets)
    unknown = [n for n in names if n not in cfg.datasets]
    if unknown:
        raise DownloadError(f"unknown dataset(s) {', '.join(unknown)}; known: "
                            f"{', '.join(cfg.datasets)}")
    fetcher = fetcher or Fetcher(retries=cfg.retries, timeout_s=cfg.timeout_s,
                                 chunk_bytes=cfg.chunk_bytes, progress=progress)
    out = []
    for name in names:
        src, dest = cfg.datasets[name], cfg.path(name)
        with sums_lock(cfg.dir):
            recorded = read_sums(cfg.dir).get(dest.name)
        expected, why = (src.sha256, "pinned in the config") if src.sha256 else (
            (recorded.sha256, f"recorded in {cfg.dir / SUMS_FILE}") if recorded else (None, ""))
        if dest.exists() and not force:
            rec = file_sha256(dest)
            if expected is not None and rec.sha256 != expected:
                raise ChecksumError(
                    f"{dest}: sha256 {rec.sha256} is not the {expected} {why}: the file is "
                    f"damaged or was replaced. Fetch it again with `accelgen download --force "
                    f"--only {name}` (it is replaced only if the new bytes match), or, if the "
                    f"upstream file changed on purpose, delete its lines from {SUMS_FILE}.")
            rec = FileRecord(rec.file, rec.size, rec.sha256,
                             recorded.url if recorded is not None else None)
            action = "verified" if expected is not None else "recorded"
        else:
            try:
                rec = fetcher.fetch(src.url, dest, expected, label=name)
            except ChecksumError as exc:
                kept = f" The file already there ({dest}) is kept." if dest.exists() else ""
                raise ChecksumError(f"{exc} ({why}).{kept} If the upstream file changed on "
                                    f"purpose, delete its lines from {SUMS_FILE} (or update "
                                    "the pinned sha256).") from None
            except DownloadError as exc:
                raise DownloadError(f"{name}: {exc}. {_fix(name, dest)}") from None
            action = "downloaded"
        with sums_lock(cfg.dir):
            sums = read_sums(cfg.dir)
            if sums.get(dest.name) != rec:
                sums[dest.name] = rec
                write_sums(cfg.dir, sums)
        out.append(Outcome(name, dest, rec, action))
    return out
