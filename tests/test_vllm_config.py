"""The vLLM plugin's configuration, SLO parsing, version pin and tiny model (no vLLM needed)."""

from __future__ import annotations

import json
import math

import pytest

from accelgen.costmodel.linear import LinearCostModel, OnlineLinearCostModel
from accelgen.vllm_integration.adapter_config import (
    ENV_VAR,
    AdapterConfig,
    SLODefaults,
    SLOError,
    build_pivot,
    parse_request_slo,
    resolve_config,
)
from accelgen.vllm_integration.tiny_model import TinyModelSpec, write_tiny_model
from accelgen.vllm_integration.version import (
    SUPPORTED_VLLM_VERSION,
    UnsupportedVLLMVersion,
    check_vllm_version,
)


def test_slo_from_extra_args_and_defaults() -> None:
    d = SLODefaults(ttft_slo=2.0, tbt_slo=0.25)
    s = parse_request_slo({"ttft_slo": 0.5, "tbt_slo": 0.1, "req_id": 7, "source": "alpaca"}, d)
    assert (s.ttft_slo, s.tbt_slo, s.jct_slo, s.req_id, s.source) == (0.5, 0.1, math.inf, 7,
                                                                      "alpaca")
    s = parse_request_slo(None, d)
    assert (s.ttft_slo, s.tbt_slo, s.online, s.req_id) == (2.0, 0.25, True, None)
    # An offline request has no per-token deadlines unless it asks for them.
    s = parse_request_slo({"online": False, "jct_slo": 30.0}, d)
    assert (s.ttft_slo, s.tbt_slo, s.jct_slo) == (math.inf, math.inf, 30.0)
    assert parse_request_slo({"ttft_slo": 1}, d).ttft_slo == 1.0  # ints are seconds too


@pytest.mark.parametrize("extra, fragment", [
    ({"ttft_slo": -1.0}, "ttft_slo=-1.0 must be > 0"),
    ({"tbt_slo": 0}, "tbt_slo=0 must be > 0"),
    ({"jct_slo": float("nan")}, "jct_slo=nan"),
    ({"ttft_slo": "fast"}, "ttft_slo='fast' is not a number"),
    ({"tbt_slo": True}, "tbt_slo=True is not a number"),
    ({"online": "yes"}, "online='yes' is not a boolean"),
    ({"req_id": -3}, "req_id=-3"),
    ({"predicted_output_len": 0}, "predicted_output_len=0"),
    ({"predicted_output_len": 10**8}, "predicted_output_len=100000000"),
    ({"jct_slo": 2e6}, "jct_slo=2000000.0 is larger than 1e"),
    ({"ttf_slo": 1.0}, "ttf_slo is not an SLO the plugin knows"),
    ({"online": 2}, "online=2 is not a boolean"),
    ({"req_id": 2**40}, "req_id=1099511627776 is not an integer in"),
    ({"source": 5}, "source=5 is not a string"),
])
def test_bad_slo_values_are_named(extra: dict, fragment: str) -> None:
    with pytest.raises(SLOError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_request_slo(extra, SLODefaults())


def test_vllm_server_integers_for_booleans_and_infinite_slos() -> None:
    # vLLM's OpenAI server turns JSON booleans in vllm_xargs into 0/1.
    s = parse_request_slo({"online": 0, "jct_slo": 30.0}, SLODefaults())
    assert (s.online, s.ttft_slo, s.tbt_slo, s.jct_slo) == (False, math.inf, math.inf, 30.0)
    assert parse_request_slo({"online": 1}, SLODefaults()).online is True
    # inf is "no deadline", on purpose; large finite values are not.
    assert parse_request_slo({"ttft_slo": math.inf}, SLODefaults()).ttft_slo == math.inf
    assert parse_request_slo({"jct_slo": 1e6}, SLODefaults()).jct_slo == 1e6


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SLOError) as err:
        parse_request_slo({"ttft_slo": -1, "tbt_slo": "x"}, SLODefaults())
    assert "ttft_slo" in str(err.value) and "tbt_slo" in str(err.value)
    assert err.value.fields == ["ttft_slo", "tbt_slo"]


def test_config_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_config({}).policy.name == "accelgen-closed"
    monkeypatch.setenv(ENV_VAR, json.dumps({"policy": {"name": "vllm"}, "s_pf": 128}))
    assert resolve_config({}).policy.name == "vllm"
    # additional_config travels with vLLM's config and wins over the environment.
    cfg = resolve_config({"accelgen": {"policy": {"name": "sarathi", "params": {"x": 1}}}})
    assert cfg.policy.name == "sarathi" and cfg.policy.params == {"x": 1}
    f = tmp_path / "plugin.yaml"
    f.write_text("policy: {name: orca}\nslo: {ttft_slo: 3.0}\n")
    monkeypatch.setenv(ENV_VAR, str(f))
    cfg = resolve_config(None)
    assert cfg.policy.name == "orca" and cfg.slo.ttft_slo == 3.0


def test_bad_config_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="additional_config"):
        resolve_config({"accelgen": {"slo": {"ttft_slo": -1}}})
    with pytest.raises(ValueError, match=r"unknown_key|extra"):
        resolve_config({"accelgen": {"unknown_key": 1}})
    monkeypatch.setenv(ENV_VAR, "{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        resolve_config({})
    monkeypatch.setenv(ENV_VAR, "/nonexistent/plugin.yaml")
    with pytest.raises(FileNotFoundError):
        resolve_config({})


def test_config_survives_json_round_trip() -> None:
    # The replay hands the config to vLLM as additional_config, which vLLM hashes as JSON.
    cfg = AdapterConfig(s_pf=256)
    raw = json.loads(json.dumps(cfg.model_dump(mode="json")))
    assert resolve_config({"accelgen": raw}) == cfg


def test_pivot_given_or_found() -> None:
    cost = LinearCostModel(0.01, 1e-4)
    p = build_pivot(AdapterConfig(s_pf=256), cost, block_size=32, max_model_len=4096)
    assert p.s_pf == 256 and p.t_pf == pytest.approx(0.01 + 256e-4)
    found = build_pivot(AdapterConfig(), cost, block_size=32, max_model_len=4096)
    assert found.s_pf % 32 == 0 and 32 <= found.s_pf <= 4096


def test_version_pin() -> None:
    assert check_vllm_version(SUPPORTED_VLLM_VERSION) == SUPPORTED_VLLM_VERSION
    assert check_vllm_version("0.32.0+cpu") == "0.32.0+cpu"
    for other in ("0.31.2", "0.33.0", "0.32.0rc1", "0.32.1"):
        with pytest.raises(UnsupportedVLLMVersion, match=r"supports vllm 0\.32\.0 only"):
            check_vllm_version(other)


def test_tiny_model_config(tmp_path) -> None:
    out = write_tiny_model(tmp_path / "m", TinyModelSpec(num_layers=3, hidden_size=128,
                                                         num_heads=2, num_kv_heads=1))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3 and cfg["head_dim"] == 64
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    mtime = (out / "config.json").stat().st_mtime_ns
    write_tiny_model(out, TinyModelSpec(num_layers=3, hidden_size=128, num_heads=2,
                                        num_kv_heads=1))
    assert (out / "config.json").stat().st_mtime_ns == mtime  # unchanged content: no rewrite
    with pytest.raises(ValueError, match="head size 16"):
        TinyModelSpec(hidden_size=64, num_heads=4)


def test_online_cost_model_refits_to_measured_steps() -> None:
    from accelgen.core.iteration import BatchShape
    from accelgen.vllm_integration.adapter_config import CostSpec, build_cost_model

    cost = build_cost_model(CostSpec(kind="online", base_s=0.5, per_token_s=0.0, refit_every=4))
    assert isinstance(cost, OnlineLinearCostModel)
    changed = [cost.observe(n, 0.002 + 1e-5 * n) for n in (10, 100, 200, 400)]
    assert changed == [False, False, False, True] and cost.refits == 1
    assert cost.base_s == pytest.approx(0.002) and cost.per_token_s == pytest.approx(1e-5)
    shape = BatchShape()
    shape.add_prefill(300, 0)
    assert cost.iteration_time(shape) == pytest.approx(0.005)
    assert not cost.observe(0, 1.0) and not cost.observe(5, float("nan"))
    for n in (10, 20, 30, 40):  # noise that would tilt the line negative
        cost.observe(n, 0.01 - n * 1e-4)
    assert cost.per_token_s >= 0.0
