"""The profile stage and the GPU configuration, on what a CPU can check: the torch profiler's
flash-attn path (its packed varlen layout against SDPA, with a plain-torch stand-in for the
kernel), the attention choice and the fallback recorded in the profile, the vLLM backend's
options for real checkpoints, the pipeline's wiring (deployments profiled before their traces,
engine settings to replays and profiles, GPU resources), `accelgen trace --profile-csv`, and the
dry run of config/gpu.yaml."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from accelgen.cli import main as cli_main
from accelgen.costmodel.datasheets import MODELS
from accelgen.pipeline import config_file as pc
from accelgen.pipeline.grid import Grid
from accelgen.profiling.grid import Shape, gpu_grid
from accelgen.profiling.torch_backend import TorchOptions, select_attention
from accelgen.profiling.torch_model import build_model, make_batch, varlen_reference

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "config" / "gpu.yaml"
CPU_ENGINE = ROOT / "config" / "cpu-engine.yaml"
SHAPES = (Shape.prefill(40), Shape.prefill(33, seqs=3), Shape.prefill(16, ctx=50),
          Shape.decode(5, 21), Shape.mixed(24, 3, 10))


def _metadata(path: Path) -> dict[str, str]:
    meta = {}
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            key, _, value = line[2:].partition(": ")
            meta[key] = value
    return meta


def _hidden(net: torch.nn.Module, shape: Shape) -> torch.Tensor:
    """The last layer's output for ``shape`` (before the LM head's argmax, which hides detail)."""
    batch = make_batch(net, shape)
    with torch.inference_mode():
        x = net.embed(batch.token_ids)
        rope = None
        if net.pos is not None:
            x = x + net.pos(batch.positions + 2)
        else:
            ang = batch.positions.to(net.inv_freq.dtype)[:, None] * net.inv_freq[None, :]
            rope = (ang.cos().to(x.dtype), ang.sin().to(x.dtype))
        for i, layer in enumerate(net.layers):
            x = layer(x, batch, i, rope)
    return x


# ----------------------------------------------------------------------------------------------
# the torch profiler's attention


@pytest.mark.parametrize("name", ["tiny", "llama-gqa"])
def test_packed_varlen_attention_computes_what_grouped_sdpa_computes(name: str) -> None:
    """The flash layout (one KV tensor per layer, cu_seqlens, new keys written to their slots,
    bottom-right causal mask) gives the same hidden states as SDPA per group; the stand-in has
    flash_attn_varlen_func's signature and semantics, so on a GPU only the kernel changes."""
    model = MODELS["tiny"] if name == "tiny" else MODELS["llama-13b"].model_copy(update={
        "num_layers": 2, "hidden_size": 128, "num_heads": 4, "num_kv_heads": 2,
        "ffn_size": 256, "vocab_size": 1000})
    sdpa = build_model(model, seed=5)
    flash = build_model(model, seed=5, varlen=varlen_reference)
    for shape in SHAPES:
        packed = make_batch(flash, shape).packed
        assert packed is not None and packed.new_slots.numel() == shape.forward_size
        torch.testing.assert_close(_hidden(flash, shape), _hidden(sdpa, shape))


def test_the_equivalence_check_would_see_a_wrong_mask() -> None:
    """A kernel without the causal mask gives other results for prompts (not for decodes)."""
    def no_mask(*args: object, causal: bool = False, **kw: object) -> torch.Tensor:
        return varlen_reference(*args, causal=False)  # type: ignore[arg-type]

    sdpa = build_model(MODELS["tiny"], seed=5)
    wrong = build_model(MODELS["tiny"], seed=5, varlen=no_mask)
    assert not torch.allclose(_hidden(wrong, Shape.prefill(40)), _hidden(sdpa, Shape.prefill(40)))
    torch.testing.assert_close(_hidden(wrong, Shape.decode(5, 21)),
                               _hidden(sdpa, Shape.decode(5, 21)))


def _fake_kernel(*args: object, **kw: object) -> torch.Tensor:
    raise AssertionError("not called")


@pytest.mark.parametrize("device,dtype,probe,expect", [
    ("cpu", torch.float32, None, "need a CUDA device"),
    ("cuda", torch.float32, None, "needs float16 or bfloat16"),
    ("cuda", torch.float16, (None, "ModuleNotFoundError: No module named 'flash_attn'"),
     "flash-attn is not usable here (ModuleNotFoundError"),
    ("cuda", torch.bfloat16, (_fake_kernel, "2.8.3"), "flash-attn 2.8.3 flash_attn_varlen_func"),
])
def test_attention_choice_and_why(device: str, dtype: torch.dtype, probe: object,
                                  expect: str) -> None:
    def fake_probe() -> object:
        assert probe is not None, "the kernel is looked up only where it could run"
        return probe

    opts = TorchOptions(device=device)
    kernel, text = select_attention(opts, dtype, fake_probe)  # type: ignore[arg-type]
    assert expect in text
    assert (kernel is not None) == text.startswith("flash-attn")
    if kernel is None:
        assert text.startswith("torch SDPA") and "fallback" in text
        with pytest.raises(ValueError, match="--attention flash"):
            select_attention(TorchOptions(device=device, attention="flash"), dtype,
                             fake_probe)  # type: ignore[arg-type]
    sdpa, why = select_attention(TorchOptions(device=device, attention="sdpa"), dtype,
                                 fake_probe)  # type: ignore[arg-type]
    assert sdpa is None and "--attention sdpa" in why


def test_torch_profile_says_which_attention_it_timed(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    assert cli_main(["profile", "--backend", "torch", "--model", "tiny", "--device", "cpu",
                     "--quick", "--repeats", "1", "--warmup", "0", "--threads", "1",
                     "--out", str(out)]) == 0
    meta = _metadata(out)
    assert meta["attention"].startswith("torch SDPA")
    assert "flash-attn's kernels need a CUDA device" in meta["attention"]
    assert cli_main(["profile", "--backend", "torch", "--model", "tiny", "--device", "cpu",
                     "--quick", "--attention", "flash", "--out", str(tmp_path / "f.csv")]) == 2
    assert not (tmp_path / "f.csv").exists()


# ----------------------------------------------------------------------------------------------
# the vLLM backend's options


def test_vllm_engine_spec_of_a_real_checkpoint_and_of_a_shape(tmp_path: Path) -> None:
    from accelgen.profiling.vllm_backend import VllmOptions, engine_spec

    real = engine_spec(VllmOptions(model="facebook/opt-13b", tp=2, work_dir=tmp_path,
                                   engine={"dtype": "float16"}))
    assert real.model == "facebook/opt-13b" and real.load_format == "auto"
    assert real.extra_args == {"tensor_parallel_size": 2} and real.dtype == "float16"
    shape = engine_spec(VllmOptions(model="opt-125m", work_dir=tmp_path))
    assert shape.load_format == "dummy" and (Path(shape.model) / "config.json").exists()
    assert engine_spec(VllmOptions(model="tiny")).model is None


def test_vllm_sweep_keeps_to_the_step_budget_and_the_kv_cache() -> None:
    from accelgen.profiling.vllm_backend import VllmOptions, kv_need, vllm_shapes

    opts = VllmOptions(grid="gpu", max_tokens=2048, max_num_batched_tokens=2048,
                       max_num_seqs=256)
    every = vllm_shapes(opts, 2048)
    assert {s.kind for s in every} == {"prefill", "decode", "mixed"}
    assert max(s.forward_size for s in every) == 2048 and len(every) < len(gpu_grid(2048))
    kv = 491 * 32  # OPT-13B's 12 GiB on one A100
    fits = vllm_shapes(opts, 2048, kv_tokens=kv)
    assert fits and all(kv_need(s, 32) <= kv for s in fits) and len(fits) < len(every)
    assert kv_need(Shape.decode(4, 40), 32) == 4 * 64 and kv_need(Shape.prefill(33), 32) == 64


def test_vllm_profile_refuses_bad_engine_json(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "v.csv"
    assert cli_main(["profile", "--backend", "vllm", "--model", "facebook/opt-13b",
                     "--engine", "{not json", "--out", str(out)]) == 2
    assert "--engine: not valid JSON" in capsys.readouterr().err and not out.exists()


# ----------------------------------------------------------------------------------------------
# `accelgen trace --profile-csv` and the replay's --engine


def test_trace_takes_ttft_slos_from_a_profile(tmp_path: Path) -> None:
    from accelgen.workloads.trace import load_trace, read_trace_metadata

    prof = tmp_path / "p.csv"
    assert cli_main(["profile", "--backend", "analytic", "--deployment", "llama-13b",
                     "--out", str(prof)]) == 0
    # A table 3x slower than the analytic model: SLOs must follow the table, not the model.
    lines = []
    for line in prof.read_text().splitlines():
        if line and line[0].isalpha() and not line.startswith("kind"):
            cells = line.split(",")
            cells[6] = repr(3 * float(cells[6]))
            line = ",".join(cells)
        lines.append(line)
    prof.write_text("\n".join(lines) + "\n")
    base = ["trace", "--num-requests", "60", "--quiet", "--model", "llama-13b"]
    assert cli_main([*base, "--out", str(tmp_path / "a.parquet")]) == 0
    assert cli_main([*base, "--profile-csv", str(prof), "--out", str(tmp_path / "p.parquet")]) == 0
    a, p = load_trace(tmp_path / "a.parquet"), load_trace(tmp_path / "p.parquet")
    assert (p["prompt_len"] == a["prompt_len"]).all()
    ratio = (p["ttft_slo"] / a["ttft_slo"]).to_numpy()
    assert ratio == pytest.approx(3.0, rel=0.05)
    assert str(prof) in read_trace_metadata(tmp_path / "p.parquet")["prefill_latency"]


def test_replay_engine_json_merges_into_the_experiments_engine(tmp_path: Path) -> None:
    import argparse

    from accelgen.cli.replay import add_parser, build_config

    exp = tmp_path / "dep.yaml"
    exp.write_text(yaml.safe_dump({"deployment": {"model": "opt-13b", "max_model_len": 2048}}))
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    engine = {"model": "facebook/opt-13b", "load_format": "auto", "dtype": "float16",
              "extra_args": {"tensor_parallel_size": 2}}
    args = parser.parse_args(["replay", "--trace", "t.parquet", "--out", "o", "--config",
                              str(exp), "--engine", json.dumps(engine)])
    cfg = build_config(args)
    assert cfg.engine.model == "facebook/opt-13b" and cfg.engine.load_format == "auto"
    assert cfg.engine.extra_args == {"tensor_parallel_size": 2}
    assert cfg.engine.num_gpu_blocks == 492  # the deployment's 12 GiB, + vLLM's null block
    assert cfg.engine.max_model_len == 2048
    bad = parser.parse_args(["replay", "--trace", "t", "--out", "o", "--engine", "[1]"])
    with pytest.raises(ValueError, match="--engine"):
        build_config(bad)


# ----------------------------------------------------------------------------------------------
# the pipeline's wiring


def merged(path: Path) -> dict:
    """A config as Snakemake sees it: deep-merged over config/quick.yaml (its default)."""
    quick = yaml.safe_load((ROOT / "config" / "quick.yaml").read_text())
    return pc.deep_merge(quick, yaml.safe_load(path.read_text()))


def test_profiled_deployments_use_their_stage_table_everywhere() -> None:
    cfg = pc.load(merged(GPU))
    grid = Grid(cfg)
    assert grid.profiled() == ["opt-13b", "llama-13b", "llama-3-70b"]
    dep = cfg.deployment("opt-13b")
    assert dep.cost_model == "profile" and dep.profile_csv == Path("results/gpu/profiles/opt-13b.csv")
    assert grid.deployment_inputs("opt-13b") == [str(dep.profile_csv)]
    args = grid.trace_args("evaluation", "opt-13b")
    assert args[args.index("--profile-csv") + 1] == str(dep.profile_csv)
    assert args[args.index("--max-model-len") + 1] == "2047"  # the checkpoint's 2K context
    assert str(dep.profile_csv) in grid.figure_inputs("extra_pivots")
    # GPUs: TP 4 for Llama-3-70B; its engine and profile get tensor_parallel_size 4.
    assert [grid.gpus(d) for d in grid.profiled()] == [1, 1, 4]
    engine = json.loads(grid.engine_json("llama-3-70b"))
    assert engine["model"] == "meta-llama/Meta-Llama-3-70B" and engine["load_format"] == "auto"
    assert engine["extra_args"]["tensor_parallel_size"] == 4
    prof = grid.profile_args("llama-3-70b")
    assert prof[prof.index("--tp") + 1] == "4" and json.loads(prof[prof.index("--engine") + 1]) \
        == engine
    assert grid.replay_args("vllm-stock") == ["--system", "stock"]
    assert grid.replay_args("accelgen")[:2] == ["--policy", "accelgen"]


def test_cpu_engine_config_profiles_the_tiny_cpu_engine() -> None:
    cfg = pc.load(merged(CPU_ENGINE))
    grid = Grid(cfg)
    assert grid.profiled() == ["tiny-cpu"] and grid.gpus("tiny-cpu") == 0
    assert grid.engine_json("tiny-cpu") == ""
    prof = grid.profile_args("tiny-cpu")
    assert prof[prof.index("--model") + 1] == "tiny" and "--grid" in prof
    assert sorted(grid.downloads().values()) == ["alpaca", "bookcorpus", "sharegpt"]


BAD_STAGE = {
    "table and stage": ({"deployments": {"opt-13b": {"profile": {}, "profile_csv": "x.csv"}}},
                        "deployments.opt-13b: profile_csv"),
    "torch on 8 GPUs": ({"deployments": {"opt-175b": {"profile": {"backend": "torch"}}}},
                        "deployments.opt-175b.profile.backend"),
    "stock not vllm": ({"systems": {"sarathi": {"policy": "sarathi",
                                                "vllm_scheduler": "stock"}}},
                       "systems.sarathi.vllm_scheduler"),
    "datasets elsewhere": ({"workload": {"kind": "datasets", "path": "elsewhere"},
                            "experiments": {"sensitivity": None}},
                           "workload.path"),
    "bad url": ({"download": {"datasets": {"alpaca": {"url": "ftp://x"}}}},
                "download.datasets.alpaca.url"),
}


@pytest.mark.parametrize("case", list(BAD_STAGE), ids=list(BAD_STAGE))
def test_bad_stage_config_names_the_key(case: str) -> None:
    over, key = BAD_STAGE[case]
    quick = yaml.safe_load((ROOT / "config" / "quick.yaml").read_text())
    with pytest.raises(pc.PipelineConfigError) as err:
        pc.load(pc.deep_merge(quick, over))
    assert key in str(err.value), str(err.value)


def snakemake(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_gpu_config_dry_run_plans_download_profile_trace_replay_and_figures() -> None:
    res = snakemake("-n", "-p", "--forceall", "--configfile", str(GPU))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1].split("\n\n")[0],
                             re.M))
    grid = Grid(pc.load(merged(GPU)))
    assert int(counts["download"]) == 3 and int(counts["profile"]) == 3
    assert int(counts["trace"]) == len(grid.traces())
    assert int(counts["replay"]) == len(grid.runs()) == 21
    assert "simulate" not in counts and "fidelity_run" not in counts
    assert int(counts["aggregate"]) >= 4 and {"notebook_evaluation", "notebook_ablation",
                                              "notebook_measurement"} <= set(counts)
    assert "gpu=4" in out and "--engine" in out and "--system stock" in out
    assert "accelgen.cli download --spec" in out and "accelgen.cli profile --backend vllm" in out
    assert "--model meta-llama/Meta-Llama-3-70B --tp 4" in out
