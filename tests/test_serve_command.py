"""``accelgen serve``'s command line (``--dry-run``): what it hands vLLM's OpenAI server, and
what it refuses before the server starts. No vLLM needed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from accelgen.cli import main


def dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> list[str]:
    assert main(["serve", "--dry-run", "--tiny-dir", str(tmp_path / "tiny"), *args]) == 0
    words = shlex.split(capsys.readouterr().out.strip())
    return words[words.index("-m"):]  # after the environment and the interpreter


def option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_the_command_has_what_the_plugin_needs(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    words = dry_run(capsys, tmp_path, "--policy", "sarathi", "--param", "token_budget=128",
                    "--slo", "ttft_slo=2.5", "--log-dir", str(tmp_path / "logs"),
                    "--port", "8123", "--max-model-len", "2048")
    assert words[:2] == ["-m", "accelgen.vllm_integration.api_server"]
    assert option(words, "--scheduler-cls") == (
        "accelgen.vllm_integration.scheduler.AccelGenScheduler")
    for flag in ("--no-enable-prefix-caching",):
        assert flag in words
    # Async scheduling is vLLM's to decide (its default), or the user's.
    assert not any("async-scheduling" in w for w in words)
    assert option(words, "--middleware") == "accelgen.vllm_integration.slo_http.SLOMiddleware"
    assert option(words, "--load-format") == "dummy"
    # The tiny model, with its tokenizer: text and chat work, so nothing skips the tokenizer.
    assert "--skip-tokenizer-init" not in words
    for name in ("config.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        assert Path(option(words, "--model"), name).exists()
    plugin = json.loads(option(words, "--additional-config"))["accelgen"]
    assert plugin["policy"] == {"name": "sarathi", "params": {"token_budget": 128}}
    assert plugin["slo"] == {"ttft_slo": 2.5}
    assert plugin["log_dir"] == str((tmp_path / "logs").resolve())
    # vLLM's own options pass through unchanged.
    assert option(words, "--port") == "8123" and option(words, "--max-model-len") == "2048"
    assert option(words, "--shutdown-timeout") == "30"


def test_the_tiny_model_has_a_short_name_and_whole_word_output(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    words = dry_run(capsys, tmp_path)
    assert option(words, "--served-model-name") == "accelgen-tiny"
    assert option(words, "--logits-processors") == (
        "accelgen.vllm_integration.tiny_output:WholeWordOutput")
    # The user's own name (vLLM's option) wins; a model of the user's gets neither.
    words = dry_run(capsys, tmp_path, "--served-model-name", "mine")
    assert words.count("--served-model-name") == 1 and option(words, "--served-model-name") == "mine"
    words = dry_run(capsys, tmp_path, "--model", "facebook/opt-125m")
    assert "--served-model-name" not in words and "--logits-processors" not in words


def test_stock_runs_the_instrumented_scheduler(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    words = dry_run(capsys, tmp_path, "--system", "stock", "--shutdown-timeout", "5")
    assert option(words, "--scheduler-cls") == (
        "accelgen.vllm_integration.scheduler.InstrumentedScheduler")
    assert option(words, "--shutdown-timeout") == "5" and words.count("--shutdown-timeout") == 1


def test_the_shutdown_grace_goes_to_the_plugin(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    words = dry_run(capsys, tmp_path, "--shutdown-grace", "2.5")
    assert json.loads(option(words, "--additional-config"))["accelgen"] == {
        "shutdown_grace_s": 2.5}
    # vLLM's abort mode (timeout 0) ends every request at once itself: any grace is moot.
    dry_run(capsys, tmp_path, "--shutdown-grace", "20", "--shutdown-timeout", "0")


@pytest.mark.parametrize("flag", ["--async-scheduling", "--no-async-scheduling"])
def test_async_scheduling_is_vllms_option(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          flag: str) -> None:
    words = dry_run(capsys, tmp_path, flag)
    assert [w for w in words if "async-scheduling" in w] == [flag]


def test_user_additional_config_is_kept(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    words = dry_run(capsys, tmp_path, "--additional-config", '{"other": 1}')
    assert words.count("--additional-config") == 1
    assert json.loads(option(words, "--additional-config")) == {"other": 1, "accelgen": {}}


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "no-such-policy"], "unknown policy 'no-such-policy'"),
    (["--policy", "oracle"], "clairvoyant"),
    (["--param", "no_such_param=1"], "bad parameters for policy 'accelgen-closed'"),
    (["--slo", "ttft_slo=-1"], "ttft_slo"),
    (["--system", "stock", "--policy", "sarathi"], "--system stock"),
    (["--scheduler-cls", "x.Y"], "sets --scheduler-cls itself"),
    (["--enable-prefix-caching"], "sets --enable-prefix-caching itself"),
    (["--additional-config", '{"accelgen": {}}'], "without an 'accelgen' key"),
    (["--additional-config", "{not json"], "--additional-config is not JSON"),
    (["--shutdown-grace", "26"], "--shutdown-grace 26 s leaves the engine less than 5 s of "
                                 "--shutdown-timeout 30 s"),
    (["--shutdown-grace", "8", "--shutdown-timeout", "12"], "--shutdown-timeout 12 s"),
    (["--shutdown-grace", "-1"], "shutdown_grace_s"),
])
def test_refused_before_the_server_starts(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          args: list[str], message: str) -> None:
    assert main(["serve", "--dry-run", "--tiny-dir", str(tmp_path / "tiny"), *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""  # no command printed


def test_other_commands_still_refuse_unknown_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["pivot", "--deployment", "opt-13b", "--no-such-option"])
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_stock_priority_mode_passes_through(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    # vLLM's priority mode; InstrumentedScheduler then sets each request's priority from its
    # SLO class (tests/test_vllm_engine.py runs it on the engine).
    words = dry_run(capsys, tmp_path, "--system", "stock", "--scheduling-policy", "priority")
    assert option(words, "--scheduling-policy") == "priority"
    assert option(words, "--scheduler-cls") == (
        "accelgen.vllm_integration.scheduler.InstrumentedScheduler")


def test_the_engines_batch_limit_is_the_policys_budget_or_the_users_cap(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Without --max-num-batched-tokens serve sizes the engine's batch limit to the policy's
    largest token budget (AccelGen: S_pf x budget_cap, here above vLLM's default 2048, which
    would have cut its batches); one given caps the policy instead. The startup line says which."""
    words = dry_run(capsys, tmp_path, "--block-size", "32")
    assert option(words, "--max-num-batched-tokens") == "3648"
    main(["serve", "--dry-run", "--tiny-dir", str(tmp_path / "tiny"), "--block-size", "32"])
    assert ("accelgen serve: max_num_batched_tokens=3648 (the policy's largest token budget)"
            in capsys.readouterr().err)
    words = dry_run(capsys, tmp_path, "--block-size", "32", "--param", "budget_cap=0.5")
    assert option(words, "--max-num-batched-tokens") == "1824"
    main(["serve", "--dry-run", "--tiny-dir", str(tmp_path / "tiny"), "--block-size", "32",
          "--max-num-batched-tokens", "1024"])
    out = capsys.readouterr()
    assert shlex.split(out.out).count("--max-num-batched-tokens") == 1
    assert option(shlex.split(out.out), "--max-num-batched-tokens") == "1024"
    assert ("max_num_batched_tokens=1024 (set by the user) caps the policy's token budget (its "
            "own largest: 3648)") in out.err
    # Stock vLLM keeps vLLM's own default.
    assert "--max-num-batched-tokens" not in dry_run(capsys, tmp_path, "--system", "stock")
