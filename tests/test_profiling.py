"""``accelgen profile``: shapes, the torch decoder, the CSV it writes, and the pivot read from it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from accelgen.cli import main as cli_main
from accelgen.core.specs import Deployment
from accelgen.costmodel.datasheets import MODELS
from accelgen.costmodel.factory import deployment_pivot, make_cost_model, resolve_deployment
from accelgen.costmodel.pivot import SweepPoint
from accelgen.costmodel.table import ProfileCostModel, read_profile_csv
from accelgen.profiling.grid import Shape, cpu_grid, gpu_grid, prefill_sizes, quick_grid
from accelgen.profiling.measure import Measurement, interleaved, pivot_report, write_profile

torch = pytest.importorskip("torch")


def _metadata(path: Path) -> dict[str, str]:
    meta = {}
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
    return meta


# -- shapes ---------------------------------------------------------------------------------


def test_shape_chunks_match_the_profile_table_split() -> None:
    for shape in [Shape.prefill(515, seqs=4), Shape.prefill(96, ctx=1000), Shape.decode(7, 300),
                  Shape.mixed(256, 32, 1024), Shape(100, 3, 50, 5, 23)]:
        row_shape = shape.row(1.0).shape()
        assert sum(shape.chunks()) == shape.prefill_tokens
        assert max(shape.chunks(), default=0) - min(shape.chunks(), default=0) <= 1
        assert sum(shape.decode_contexts()) == shape.decode_ctx
        assert row_shape.forward_size == shape.forward_size
        assert row_shape.decode_ctx == shape.decode_ctx
        pairs = sum(n * (shape.prefill_ctx + (n + 1) / 2) for n in shape.chunks())
        assert row_shape.prefill_attn == pytest.approx(pairs)


@pytest.mark.parametrize("bad", [(0, 0, 0, 0, 0), (10, 0, 0, 0, 0), (4, 5, 0, 0, 0),
                                 (0, 0, 0, 3, 2), (0, 0, 8, 1, 1)])
def test_shape_rejects_impossible_compositions(bad: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        Shape(*bad)


def test_grids_stay_within_the_model_and_cover_every_fitted_term() -> None:
    assert prefill_sizes(2048)[0] == 16 and prefill_sizes(2048)[-1] == 2048
    assert prefill_sizes(100) == [16, 32, 64, 96, 100]
    assert prefill_sizes(2048) == sorted(set(prefill_sizes(2048)))
    for grid, top in ((cpu_grid(2048), 2048), (quick_grid(512), 512), (gpu_grid(8192), 8192)):
        assert all(s.max_len() <= 2 * top for s in grid)
        kinds = {s.kind for s in grid}
        assert kinds == {"prefill", "decode", "mixed"}
        assert any(s.prefill_ctx > 0 for s in grid)
        assert sum(s.is_base for s in grid) >= 2
    assert all(s.max_len() <= 2048 for s in cpu_grid(2048))


# -- the torch decoder ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "llama-13b"])
def test_random_decoder_runs_every_shape_kind(name: str) -> None:
    from accelgen.profiling.torch_model import build_model, kv_bytes, make_batch

    model = MODELS[name]
    if name != "tiny":  # a 1-layer, narrow copy keeps the Llama path (RMSNorm, rope, SwiGLU) cheap
        model = model.model_copy(update={"num_layers": 1, "hidden_size": 128, "num_heads": 4,
                                         "num_kv_heads": 2, "ffn_size": 256, "vocab_size": 1000})
    net = build_model(model)
    for shape in (Shape.prefill(40), Shape.prefill(33, seqs=3), Shape.prefill(16, ctx=50),
                  Shape.decode(5, 21), Shape.mixed(24, 3, 10)):
        batch = make_batch(net, shape)
        out = net(batch)
        assert out.shape == (shape.prefill_seqs + shape.decode_seqs,)
        assert int(out.min()) >= 0 and int(out.max()) < model.vocab_size
        assert batch.token_ids.shape == (shape.forward_size,)
        assert kv_bytes(net, shape) > 0
    # The new keys were written into the cache after the prior context.
    assert not torch.all(batch.groups[-1].k_cache[0][:, :, 10] == 0.01)


def test_chunk_mask_sees_the_context_and_the_causal_past_only() -> None:
    from accelgen.profiling.torch_model import build_model, make_batch

    net = build_model(MODELS["tiny"])
    g = make_batch(net, Shape.prefill(4, ctx=3)).groups[0]
    assert g.mask is not None and g.mask.shape == (4, 7)
    assert g.mask[0].tolist() == [True] * 4 + [False] * 3
    assert g.mask[3].tolist() == [True] * 7


def test_shapes_longer_than_the_model_are_refused() -> None:
    from accelgen.profiling.torch_model import build_model, make_batch

    net = build_model(MODELS["tiny"])
    with pytest.raises(ValueError, match="positions"):
        make_batch(net, Shape.prefill(64, ctx=MODELS["tiny"].max_model_len))


# -- measurements and the CSV ---------------------------------------------------------------


def test_interleaved_passes_take_medians_and_skip_warmup() -> None:
    calls: list[Shape] = []
    a, b = Shape.prefill(16), Shape.prefill(32)
    samples = iter([9.0, 9.0, 1.0, 5.0, 3.0, 4.0, 2.0, 6.0])

    def run(shape: Shape) -> float:
        calls.append(shape)
        return next(samples)

    meas = interleaved([a, b], run, repeats=3, warmup=1)
    assert calls == [a, b] * 4  # pass by pass, not shape by shape
    assert [m.samples for m in meas] == [[1.0, 3.0, 2.0], [5.0, 4.0, 6.0]]
    assert [m.median for m in meas] == [2.0, 5.0]
    with pytest.raises(RuntimeError):
        interleaved([a], lambda s: 0.0, repeats=1, warmup=0)


def test_written_profile_loads_with_its_extra_columns(tmp_path: Path) -> None:
    meas = [Measurement(Shape.prefill(s), [s * 1e-4, s * 2e-4, s * 3e-4]) for s in (32, 64, 128)]
    meas.append(Measurement(Shape.decode(4, 100), [0.01, 0.011]))
    meas.append(Measurement(Shape.prefill(32, ctx=64), [0.004]))
    path = write_profile(tmp_path / "p.csv", meas, {"model": "x", "note": "y"})
    rows = read_profile_csv(path)
    assert [r.latency_s for r in rows] == pytest.approx([64e-4, 128e-4, 256e-4, 0.0105, 0.004])
    assert _metadata(path) == {"model": "x", "note": "y"}
    header = next(ln for ln in path.read_text().splitlines() if not ln.startswith("#"))
    assert header.endswith("latency_min_s,latency_max_s,repeats")
    ProfileCostModel.from_csv(path)


# -- accelgen profile, end to end -----------------------------------------------------------


def _check_pivot_on_measured_curve(curve: list[SweepPoint], s_pf: int, tol: float) -> None:
    """S_pf is where the measured throughput flattens: within ``tol`` of the best throughput at
    or beyond it, and every smaller size is still more than ``tol`` below that best."""
    by_size = {p.size: p for p in curve}
    best_after = max(p.throughput for p in curve if p.size >= s_pf)
    assert best_after <= (1 + tol) * by_size[s_pf].throughput
    for p in curve:
        if p.size < s_pf:
            later = max(q.throughput for q in curve if q.size >= p.size)
            assert later > (1 + tol) * p.throughput


def test_torch_profile_of_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "tiny.csv", tmp_path / "tiny.png"
    # CPU time of one thread: robust to other processes on a shared machine.
    code = cli_main(["profile", "--backend", "torch", "--model", "tiny", "--device", "cpu",
                     "--quick", "--repeats", "3", "--threads", "1", "--clock", "cpu",
                     "--out", str(out), "--plot", str(png)])
    assert code == 0
    text = capsys.readouterr().out
    rows = read_profile_csv(out)
    assert len(rows) == len(quick_grid(512))
    cost = ProfileCostModel.from_csv(out)  # the simulator's loader, no warning about unfitted terms
    assert not cost.unfitted
    meta = _metadata(out)
    assert meta["backend"].startswith("torch") and "float32" in meta["dtype"]
    # The pivot of the table is the simulator's: a deployment on this profile gets the same.
    dep = Deployment(model="tiny", hardware="cpu", cost_model="profile", profile_csv=out)
    piv = deployment_pivot(dep)
    assert int(meta["S_pf"]) == piv.s_pf
    assert float(meta["T_pf_s"]) == pytest.approx(piv.t_pf, rel=1e-5)
    assert f"S_pf = {piv.s_pf} tokens" in text
    # On the measured points: the rule holds, and the curve rose before it flattened.
    report = pivot_report(rows, MODELS["tiny"].max_model_len)
    assert int(meta["S_pf_measured_points"]) == report.measured.s_pf
    _check_pivot_on_measured_curve(report.curve, report.measured.s_pf, report.tolerance)
    first = report.curve[0]
    at_pivot = next(p for p in report.curve if p.size == report.measured.s_pf)
    assert report.measured.s_pf > first.size
    assert at_pivot.throughput > 2 * first.throughput
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        assert png.exists() and png.with_suffix(".pdf").exists()
    else:  # the plot is skipped with a hint, the profile is still written
        assert not png.exists()


def test_torch_profile_refuses_cpu_clock_with_threads(tmp_path: Path) -> None:
    code = cli_main(["profile", "--backend", "torch", "--model", "tiny", "--device", "cpu",
                     "--quick", "--threads", "2", "--clock", "cpu", "--out",
                     str(tmp_path / "x.csv")])
    assert code == 2
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("deployment", ["opt-13b", "opt-175b"])
def test_analytic_backend_round_trips_the_analytic_pivot(tmp_path: Path, deployment: str) -> None:
    out = tmp_path / f"{deployment}.csv"
    assert cli_main(["profile", "--backend", "analytic", "--deployment", deployment,
                     "--out", str(out)]) == 0
    meta = _metadata(out)
    assert "NOT measured" in meta["backend"]
    dep = resolve_deployment(deployment)
    analytic = deployment_pivot(dep)
    profiled = deployment_pivot(dep.model_copy(update={"cost_model": "profile",
                                                       "profile_csv": out}))
    assert profiled.s_pf == analytic.s_pf == int(meta["S_pf"])
    assert profiled.t_pf == pytest.approx(analytic.t_pf, rel=1e-6)
    # Fresh prefills are exact; other shapes go through the table's fit.
    table, exact = ProfileCostModel.from_csv(out), make_cost_model(dep)
    for size in (32, 768, 4096):  # profiled sizes: exact
        assert table.forward_time(size) == pytest.approx(exact.forward_time(size), rel=1e-6)
    for size in (100, 777):  # between profiled sizes: interpolated
        assert table.forward_time(size) == pytest.approx(exact.forward_time(size), rel=0.01)
    # Every row holds the analytic model's latency of exactly that shape.
    rows = read_profile_csv(out)
    assert {r.kind for r in rows} == {"prefill", "decode", "mixed"}
    for r in rows:
        assert r.latency_s == pytest.approx(exact.iteration_time(r.shape()), rel=1e-8)


def test_auto_backend_falls_back_to_analytic_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: auto measures with torch")
    out = tmp_path / "auto.csv"
    assert cli_main(["profile", "--backend", "auto", "--deployment", "opt-13b",
                     "--out", str(out)]) == 0
    assert "no CUDA device" in capsys.readouterr().out
    assert "NOT measured" in _metadata(out)["backend"]
    assert int(_metadata(out)["S_pf"]) == deployment_pivot(resolve_deployment("opt-13b")).s_pf
    assert cli_main(["profile", "--backend", "auto", "--out", str(out)]) == 2  # needs a deployment


def test_from_csv_reports_without_measuring(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.csv"
    assert cli_main(["profile", "--backend", "analytic", "--deployment", "opt-13b",
                     "--out", str(out)]) == 0
    capsys.readouterr()
    before = out.read_text()
    assert cli_main(["profile", "--from-csv", str(out), "--model", "opt-13b"]) == 0
    text = capsys.readouterr().out
    s_pf = _metadata(out)["S_pf"]
    assert f"S_pf = {s_pf} tokens" in text
    assert out.read_text() == before


def test_profile_without_out_is_an_error(tmp_path: Path) -> None:
    assert cli_main(["profile", "--backend", "analytic", "--deployment", "opt-13b"]) == 2


@pytest.mark.filterwarnings("ignore:.*no rows constrain")
def test_pivot_report_agrees_with_find_pivot_on_a_known_curve() -> None:
    # T(S) = 10 ms + S x 0.1 ms: throughput S / (10 + 0.1 S) ms rises towards 10,000 tokens/s;
    # within 3 % of the best (at 2048: 9,534) from the first S with S / (10 + 0.1 S) >= 9256/ms.
    rows = [Shape.prefill(s).row(0.010 + s * 1e-4) for s in range(32, 2049, 32)]
    rep = pivot_report(rows, 2048)
    best = 2048 / (0.010 + 2048e-4)
    expect = min(s for s in range(32, 2049, 32) if s / (0.010 + s * 1e-4) * 1.03 >= best)
    assert rep.model.s_pf == rep.measured.s_pf == expect
    assert math.isclose(rep.model.t_pf, 0.010 + expect * 1e-4, rel_tol=1e-9)


def test_vllm_backend_without_vllm_is_a_clear_error(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    # Hide vllm whether or not this Python has it, so the check runs everywhere (CI has vllm).
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "vllm" else real_find_spec(name, *a, **k))
    out = tmp_path / "v.csv"
    assert cli_main(["profile", "--backend", "vllm", "--model", "tiny", "--quick",
                     "--out", str(out)]) == 2
    assert "needs vllm" in capsys.readouterr().err
    assert not out.exists()


def test_torch_profile_leaves_out_grid_shapes_longer_than_the_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The standard (GPU) grid has decodes at 4096 tokens per sequence: a model of a 4K context
    (llama-7b, what scripts/gpu_check.sh profiles) is measured on the shapes that fit it."""
    import accelgen.profiling.torch_backend as tb

    seen: list[Shape] = []

    def fake_profile(model, shapes, opts, progress=None):  # type: ignore[no-untyped-def]
        seen.extend(shapes)
        return [Measurement(s, [1e-3 + 1e-6 * s.forward_size]) for s in shapes], {}

    monkeypatch.setattr(tb, "profile_torch", fake_profile)
    assert cli_main(["profile", "--backend", "torch", "--model", "llama-7b", "--device", "cpu",
                     "--grid", "gpu", "--out", str(tmp_path / "p.csv")]) == 0
    grid = gpu_grid(4096)
    assert seen == [s for s in grid if s.max_len() <= 4096] and len(seen) == len(grid) - 11
    assert "11 shapes of the gpu grid need more than the 4096 positions" in capsys.readouterr().err
