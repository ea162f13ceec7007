"""`accelgen download` against a loopback HTTP server: resume after a dropped connection, the
checksum record and its verification, a corrupted re-download that keeps the old file, the
offline error, and never a half-written file; then `workload.kind: datasets` on what it wrote."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from accelgen.workloads.datasets import CATALOGUE, DownloadConfig
from accelgen.workloads.download import (
    SUMS_FILE,
    ChecksumError,
    DownloadError,
    Fetcher,
    ensure,
    read_sums,
)
from tests.loopback import FileServer, dataset_files, download_section

ROOT = Path(__file__).resolve().parents[1]
FILES = dataset_files()
SHARE = CATALOGUE["sharegpt"].file


def sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def config(server: FileServer, raw: Path, **extra: object) -> DownloadConfig:
    # Small chunks so that a fixture file is many reads; no pause between attempts.
    return DownloadConfig.model_validate(download_section(server, str(raw), chunk_bytes=4096,
                                                          **extra))


def fetcher(cfg: DownloadConfig) -> Fetcher:
    return Fetcher(retries=cfg.retries, timeout_s=5, chunk_bytes=cfg.chunk_bytes, progress=False,
                   backoff_s=0.0)


def leftovers(raw: Path) -> list[str]:
    """Temporary files of a download (a `.part` may stay for a later resume; nothing else)."""
    return sorted(p.name for p in raw.iterdir() if p.name.startswith(".") and "lock" not in p.name)


@pytest.fixture
def server():
    with FileServer(dict(FILES)) as srv:
        yield srv


# ----------------------------------------------------------------------------------------------
def test_first_download_records_size_and_sha256_and_later_runs_verify(server, tmp_path):
    raw = tmp_path / "raw"
    cfg = config(server, raw)
    done = ensure(cfg, fetcher=fetcher(cfg))
    assert [o.action for o in done] == ["downloaded"] * 3
    sums = read_sums(raw)
    for name, blob in FILES.items():
        assert (raw / name).read_bytes() == blob
        assert sums[name].sha256 == sha(blob) and sums[name].size == len(blob)
        assert sums[name].url == server.url(name)
    assert leftovers(raw) == []
    if shutil.which("sha256sum"):  # the record is sha256sum's own format
        check = subprocess.run(["sha256sum", "-c", SUMS_FILE], cwd=raw, capture_output=True,
                               text=True)
        assert check.returncode == 0, check.stdout + check.stderr

    served = len(server.requests)
    again = ensure(cfg, fetcher=fetcher(cfg))
    assert [o.action for o in again] == ["verified"] * 3
    assert len(server.requests) == served  # nothing fetched again


def test_a_dropped_connection_resumes_with_a_range_request(server, tmp_path):
    raw = tmp_path / "raw"
    blob = FILES[SHARE]
    cut = len(blob) // 3
    server.drops[SHARE] = (2, cut)  # two connections die after `cut` bytes of their body
    cfg = config(server, raw)
    (out,) = ensure(cfg, ["sharegpt"], fetcher=fetcher(cfg))
    assert out.action == "downloaded"
    assert (raw / SHARE).read_bytes() == blob
    gets = server.gets(SHARE)
    assert [g.range for g in gets] == [None, f"bytes={cut}-", f"bytes={2 * cut}-"]
    assert all(g.if_range for g in gets[1:])  # the ETag guards the splice
    assert read_sums(raw)[SHARE].sha256 == sha(blob)
    assert leftovers(raw) == []


def test_an_interrupted_command_leaves_only_a_part_file_and_the_next_run_resumes(server,
                                                                                  tmp_path):
    raw = tmp_path / "raw"
    blob = FILES[SHARE]
    cut = len(blob) // 2
    server.drops[SHARE] = (1, cut)
    server.down_after_drop.add(SHARE)  # and then the host goes away
    cfg = config(server, raw, retries=1)
    with pytest.raises(DownloadError, match="HTTP 503"):
        ensure(cfg, ["sharegpt"], fetcher=fetcher(cfg))
    assert not (raw / SHARE).exists()  # never a half file under the real name
    assert (raw / f".{SHARE}.part").stat().st_size == cut
    assert SHARE not in read_sums(raw)

    server.down.clear()  # back: the next command resumes from the part file
    (out,) = ensure(cfg, ["sharegpt"], fetcher=fetcher(cfg))
    assert out.action == "downloaded" and (raw / SHARE).read_bytes() == blob
    assert server.gets(SHARE)[-1].range == f"bytes={cut}-"
    assert leftovers(raw) == []


def test_a_file_changed_upstream_restarts_instead_of_splicing(server, tmp_path):
    raw = tmp_path / "raw"
    old = FILES[SHARE]
    server.drops[SHARE] = (1, len(old) // 2)
    server.down_after_drop.add(SHARE)
    cfg = config(server, raw, retries=0)
    with pytest.raises(DownloadError):
        ensure(cfg, ["sharegpt"], fetcher=fetcher(cfg))
    new = old.replace(b"gpt", b"GPT")  # same length, other bytes, other ETag
    server.files[SHARE] = new
    server.down.clear()
    ensure(cfg, ["sharegpt"], fetcher=fetcher(cfg))
    assert (raw / SHARE).read_bytes() == new  # If-Range did not match: the server sent it whole


def test_a_corrupted_second_download_is_an_error_and_the_old_file_is_kept(server, tmp_path):
    raw = tmp_path / "raw"
    cfg = config(server, raw)
    ensure(cfg, fetcher=fetcher(cfg))
    sums_before = (raw / SUMS_FILE).read_bytes()
    good = FILES[SHARE]
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # one flipped byte in transit
    server.files[SHARE] = bytes(bad)
    with pytest.raises(ChecksumError) as err:
        ensure(cfg, ["sharegpt"], force=True, fetcher=fetcher(cfg))
    msg = str(err.value)
    assert server.url(SHARE) in msg and sha(good) in msg and "is kept" in msg
    assert (raw / SHARE).read_bytes() == good
    assert (raw / SUMS_FILE).read_bytes() == sums_before
    assert leftovers(raw) == []


def test_a_pinned_sha256_is_enforced_on_first_download(server, tmp_path):
    raw = tmp_path / "raw"
    section = download_section(server, str(raw))
    section["datasets"]["alpaca"]["sha256"] = "0" * 64
    cfg = DownloadConfig.model_validate(section)
    with pytest.raises(ChecksumError, match="pinned in the config"):
        ensure(cfg, ["alpaca"], fetcher=fetcher(cfg))
    assert not (raw / CATALOGUE["alpaca"].file).exists()
    assert leftovers(raw) == []

    section["datasets"]["alpaca"]["sha256"] = sha(FILES[CATALOGUE["alpaca"].file])
    (out,) = ensure(DownloadConfig.model_validate(section), ["alpaca"])
    assert out.action == "downloaded"


def test_a_damaged_local_file_is_reported_with_the_fix(server, tmp_path):
    raw = tmp_path / "raw"
    cfg = config(server, raw)
    ensure(cfg, ["alpaca"], fetcher=fetcher(cfg))
    path = raw / CATALOGUE["alpaca"].file
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ChecksumError, match="--force --only alpaca"):
        ensure(cfg, ["alpaca"], fetcher=fetcher(cfg))
    (out,) = ensure(cfg, ["alpaca"], force=True, fetcher=fetcher(cfg))  # the fix works
    assert out.action == "downloaded" and path.read_bytes() == FILES[path.name]


def test_redirects_are_followed_with_the_range(server, tmp_path):
    raw = tmp_path / "raw"
    blob = FILES[SHARE]
    server.redirects["resolve/main/" + SHARE] = SHARE
    server.drops[SHARE] = (1, 1000)
    section = download_section(server, str(raw), chunk_bytes=4096)
    section["datasets"]["sharegpt"]["url"] = server.url("resolve/main/" + SHARE)
    cfg = DownloadConfig.model_validate(section)
    ensure(cfg, ["sharegpt"], fetcher=fetcher(cfg))
    assert (raw / SHARE).read_bytes() == blob
    assert server.gets(SHARE)[-1].range == "bytes=1000-"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_offline_is_a_clear_error_naming_the_url_and_the_fix(tmp_path):
    raw = tmp_path / "raw"
    url = f"http://127.0.0.1:{free_port()}/alpaca_data.json"  # nothing listens there
    cfg = DownloadConfig.model_validate({"dir": str(raw), "retries": 1,
                                         "datasets": {"alpaca": {"url": url}}})
    with pytest.raises(DownloadError) as err:
        ensure(cfg, ["alpaca"], fetcher=fetcher(cfg))
    msg = str(err.value)
    assert url in msg and "kind: synthetic" in msg and "refused" in msg.lower()
    assert not raw.exists() or (leftovers(raw) == [] and not any(
        p.name == "alpaca_data.json" for p in raw.iterdir()))


def test_a_missing_file_is_not_retried(server, tmp_path):
    section = download_section(server, str(tmp_path / "raw"))
    section["datasets"]["alpaca"]["url"] = server.url("no/such/file.json")
    cfg = DownloadConfig.model_validate(section)
    with pytest.raises(DownloadError, match="HTTP 404"):
        ensure(cfg, ["alpaca"], fetcher=fetcher(cfg))
    assert len(server.gets("no/such/file.json")) == 1


def test_config_section_keeps_defaults_and_rejects_bad_values():
    cfg = DownloadConfig.model_validate({"datasets": {"alpaca": {"url": "http://m/a.json"}}})
    assert cfg.datasets["alpaca"].url == "http://m/a.json"
    assert cfg.datasets["sharegpt"].url == CATALOGUE["sharegpt"].url
    assert cfg.path("bookcorpus") == Path("data/raw") / CATALOGUE["bookcorpus"].file
    for bad in ({"datasets": {"alpaca": {"url": "/local/file.json"}}},
                {"datasets": {"alpaca": {"url": "http://x", "sha256": "abc"}}},
                {"datasets": {"wiki": {"url": "http://x"}}}):
        with pytest.raises(ValueError):
            DownloadConfig.model_validate(bad)


# ----------------------------------------------------------------------------------------------
# the command


def accelgen(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accelgen.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_cli_downloads_with_a_progress_bar_and_prints_one_summary_line(server, tmp_path):
    cfg_file = tmp_path / "exp.yaml"
    cfg_file.write_text(yaml.safe_dump({"download": download_section(server, "data/raw")}))
    res = accelgen("download", "--config", str(cfg_file), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("download: 3 files in data/raw (3 downloaded;"), last
    assert "B/s" in res.stderr or "kB" in res.stderr or "B]" in res.stderr  # tqdm, in bytes
    again = accelgen("download", "--config", str(cfg_file), "--no-progress", cwd=tmp_path)
    assert "(3 verified;" in again.stdout and again.stderr == ""


def test_cli_offline_exits_2_with_the_message(tmp_path):
    spec = json.dumps({"retries": 1})  # one reconnect, not the default five (15 s of pauses)
    res = accelgen("download", "--only", "alpaca", "--no-progress", "--spec", spec, "--url",
                   f"alpaca=http://127.0.0.1:{free_port()}/a.json", cwd=tmp_path)
    assert res.returncode == 2
    assert "accelgen download: error: alpaca: could not download http://127.0.0.1:" in res.stderr
    assert "kind: synthetic" in res.stderr
    assert not (tmp_path / "data/raw/alpaca_data.json").exists()


def test_help_says_what_is_fetched_sizes_and_licences(tmp_path):
    res = accelgen("download", "--help", cwd=tmp_path)
    assert res.returncode == 0
    for d in CATALOGUE.values():
        assert d.file in res.stdout and d.url in res.stdout
    assert res.stdout.count("size:") == 3 and res.stdout.count("licence:") == 3
    assert "CC BY-NC 4.0" in res.stdout


def test_docs_list_every_dataset_with_its_url_and_licence():
    text = (ROOT / "docs" / "workloads.md").read_text()
    for d in CATALOGUE.values():
        assert d.file in text and d.url in text, d.name


# ----------------------------------------------------------------------------------------------
# workload kind `datasets` on the downloaded files


def test_kind_datasets_builds_the_paper_mix_from_the_downloaded_files(server, tmp_path):
    from accelgen.workloads import WorkloadConfig, build_trace
    from accelgen.workloads.loaders import load_alpaca
    from accelgen.workloads.tokenizer import get_tokenizer

    raw = tmp_path / "raw"
    cfg = config(server, raw)
    ensure(cfg, fetcher=fetcher(cfg))
    wl = WorkloadConfig(kind="datasets", path=raw, num_requests=200, seed=4, max_tokens=256)
    trace = build_trace(wl)
    df, meta = trace.df, trace.meta
    assert df["source"].value_counts().to_dict() == {"sharegpt": 80, "bookcorpus": 70,
                                                     "alpaca": 50}  # 35 % BookCorpus, exactly
    assert meta["tokenizer"] == "opt (gpt2 bpe + bos)"
    sums = read_sums(raw)
    for name in ("alpaca", "sharegpt", "bookcorpus"):
        src = meta["sources"][name]
        assert src["origin"] == str(raw / CATALOGUE[name].file)
        assert src["sha256"] == sums[CATALOGUE[name].file].sha256
    assert meta["sources"]["sharegpt"]["skipped"]["conversations_under_2_turns"] > 0
    # Alpaca requests are records of the file, drawn with replacement.
    rec = load_alpaca(raw / CATALOGUE["alpaca"].file, get_tokenizer("opt"))
    pairs = set(zip(rec.prompt_len.tolist(), rec.output_len.tolist(), strict=True))
    alp = df[df["source"] == "alpaca"]
    got = list(zip(alp["prompt_len_natural"], alp["output_len_natural"], strict=True))
    assert set(got) <= pairs and len(set(got)) < len(got)  # repeats: with replacement
    # BookCorpus prompts are concatenated sentences: longer than any one sentence.
    assert (df[df["source"] == "bookcorpus"]["prompt_len_natural"] >= 512).all()
    assert np.isfinite(df["ttft_slo"]).all()


def test_kind_datasets_refuses_a_file_that_changed_since_its_download(server, tmp_path):
    from accelgen.workloads import WorkloadConfig, WorkloadError, build_trace

    raw = tmp_path / "raw"
    cfg = config(server, raw)
    ensure(cfg, fetcher=fetcher(cfg))
    path = raw / CATALOGUE["alpaca"].file
    path.write_bytes(path.read_bytes().replace(b"model", b"MODEL"))
    with pytest.raises(WorkloadError, match="--force --only alpaca"):
        build_trace(WorkloadConfig(kind="datasets", path=raw, num_requests=20))


def test_kind_datasets_without_the_files_says_how_to_get_them(tmp_path):
    from accelgen.workloads import WorkloadConfig, build_trace

    wl = WorkloadConfig(kind="datasets", path=tmp_path / "none", num_requests=10)
    with pytest.raises(FileNotFoundError, match="accelgen download"):
        build_trace(wl)


def test_kind_datasets_trace_command(server, tmp_path):
    raw = tmp_path / "data" / "raw"
    cfg = config(server, raw)
    ensure(cfg, fetcher=fetcher(cfg))
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"workload": {"kind": "datasets", "num_requests": 40}}))
    res = accelgen("trace", "--config", str(exp), "--out", "t.parquet", "--quiet", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    from accelgen.workloads.trace import read_trace_metadata

    meta = read_trace_metadata(tmp_path / "t.parquet")
    assert json.dumps(meta["config"]["kind"]) == '"datasets"'
    assert sorted(meta["sources"]) == ["alpaca", "bookcorpus", "sharegpt"]
