"""TP/PP communication fitted to measured NCCL collectives (``accelgen.costmodel.collectives``,
``collective_fit``, ``accelgen calibrate --collectives``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from accelgen.core.iteration import BatchShape
from accelgen.core.specs import AllReduceFit, CollectiveTerms, Deployment, SendRecvFit
from accelgen.costmodel import collective_fit as cf
from accelgen.costmodel.analytic import AnalyticCostModel, roofline_time
from accelgen.costmodel.collectives import (
    BUILTIN,
    all_reduce_time,
    builtin_collectives,
    nearest_fit,
    send_recv_time,
)
from accelgen.costmodel.datasheets import HARDWARE, MODELS
from accelgen.costmodel.factory import make_cost_model

FIXTURES = Path(__file__).parent / "fixtures"
BOUND = 0.15  # the acceptance: median |error| at the iteration's message sizes


# -- the package's fit against measured points ---------------------------------------------------

@pytest.mark.parametrize("hw", ["a100", "h100"])
def test_builtin_fit_holds_the_bound_on_the_committed_sample(hw: str) -> None:
    path = FIXTURES / f"nccl_sample_{hw}.csv"
    head = path.read_text().splitlines()[:2]
    assert "microsoft/vidur" in head[0] and "MIT" in head[1]  # the sample names its source
    points = cf.read_collectives(path)
    assert points.rank_counts(cf.ALL_REDUCE) == [2, 4, 8]
    for ranks in (2, 4, 8):
        s, t = points.select(cf.ALL_REDUCE, ranks)
        assert len(s) == 13  # N x 8192 x 2 bytes, N = 1, 2, 4, ..., 4096
        fit = next(f for f in BUILTIN[hw].all_reduce if f.ranks == ranks)
        err = cf.predict_all_reduce(fit, ranks, s) / t - 1
        assert np.median(np.abs(err)) <= BOUND, (hw, ranks, err)
    s, t = points.select(cf.SEND_RECV)
    err = cf.predict_send_recv(BUILTIN[hw].send_recv, s) / t - 1
    assert np.median(np.abs(err)) <= BOUND, (hw, "send_recv", err)


def test_the_old_assumed_terms_would_fail_the_bound() -> None:
    # 75 % of the per-direction NVLink bandwidth and 10 us: the terms this fit replaced. The
    # sample tells them apart from the fit (else the bound above would prove little).
    points = cf.read_collectives(FIXTURES / "nccl_sample_a100.csv")
    for ranks in (2, 4, 8):
        s, t = points.select(cf.ALL_REDUCE, ranks)
        old = 10e-6 + cf.ring_factor(ranks) * s / (HARDWARE["a100"].interconnect_bandwidth * 0.75)
        assert np.median(np.abs(old / t - 1)) > 0.3


# -- the fitting ---------------------------------------------------------------------------------

def _sizes() -> np.ndarray:
    return np.unique(np.round(np.geomspace(2048, 64 * 2 ** 20, 120)))


def test_fit_recovers_known_all_reduce_terms() -> None:
    true = AllReduceFit(ranks=4, latency_s=30e-6, startup_s=12e-6, bus_bandwidth=2e11,
                        exponent=0.8, ref_bytes=float(_sizes().max()))
    s = _sizes()
    t = cf.predict_all_reduce(true, 4, s)
    # A cluster of slow small messages (as the profiles have) must not drag the fit.
    noisy = t.copy()
    noisy[(s > 1e5) & (s < 3e5)] *= 2.5
    for times in (t, noisy):
        fit = cf.fit_all_reduce(s, times, 4)
        assert fit.exponent == pytest.approx(0.8, abs=0.02)
        assert fit.bus_bandwidth == pytest.approx(2e11, rel=0.03)
        assert fit.latency_s == pytest.approx(30e-6, rel=0.03)
        assert np.median(np.abs(cf.predict_all_reduce(fit, 4, s) / t - 1)) < 0.02


def test_fit_recovers_known_send_recv_terms() -> None:
    s = _sizes()
    t = 9e-6 + s / 3e11
    fit = cf.fit_send_recv(s, t)
    assert fit.startup_s == pytest.approx(9e-6, rel=0.01)
    assert fit.bus_bandwidth == pytest.approx(3e11, rel=0.01)


def test_fit_needs_several_sizes() -> None:
    with pytest.raises(ValueError, match="distinct message sizes"):
        cf.fit_all_reduce(np.array([1024.0, 1024.0, 2048.0]), np.array([1e-5, 1e-5, 2e-5]), 2)


def test_iteration_check_matches_nearest_sizes_only() -> None:
    s = np.array([1e3, 16384.0, 1e6, 1e9])
    sizes = cf.iteration_sizes([8192], tokens=(1, 64))  # 16 KiB and 1 MiB
    assert list(cf.nearest_points(s, sizes)) == [1, 2]
    assert list(cf.nearest_points(np.array([1e3]), sizes)) == []  # beyond sqrt(2): no match


# -- reading -------------------------------------------------------------------------------------

NCCL_TESTS = """\
# nccl-tests version 2.13.8 nccl-headers=21903 nccl-library=21903
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 2 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20
#
# Using devices
#  Rank  0 Group  0 Pid  4242 on     node1 device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  4242 on     node1 device  1 [0x0f] NVIDIA A100-SXM4-80GB
#
#  out-of-place  in-place
#  size  count  type  redop  root  time  algbw  busbw #wrong  time  algbw  busbw #wrong
#  (B)  (elements)  (us)  (GB/s)  (GB/s)  (us)  (GB/s)  (GB/s)
  1024  256  float  sum  -1  12.50  0.08  0.08  0  12.10  0.08  0.08  0
  2048  512  float  sum  -1  13.00  0.16  0.16  0  12.90  0.16  0.16  0
  4096  1024  float  sum  -1  14.25  0.29  0.29  0  14.00  0.29  0.29  0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.176
#
mpirun: some launcher chatter
# nccl-tests version 2.13.8 nccl-headers=21903 nccl-library=21903
# Collective test starting: sendrecv_perf
# Using devices
#  Rank  0 Group  0 Pid  4243 on     node1 device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  4243 on     node1 device  1 [0x0f] NVIDIA A100-SXM4-80GB
  1024  256  float  sum  -1  8.00  0.13  0.13  0  7.90  0.13  0.13  N/A
"""


def test_reads_nccl_tests_output(tmp_path: Path) -> None:
    path = tmp_path / "node.log"
    path.write_text(NCCL_TESTS)
    p = cf.read_collectives(path)
    assert list(p.op) == [cf.ALL_REDUCE] * 3 + [cf.SEND_RECV]
    assert list(p.ranks) == [2, 2, 2, 2]
    assert list(p.nbytes) == [1024, 2048, 4096, 1024]
    assert p.time_s == pytest.approx([12.5e-6, 13e-6, 14.25e-6, 8e-6])  # out-of-place, us


def test_nccl_tests_without_banner_takes_the_collective_from_the_file_name(tmp_path: Path) -> None:
    body = "\n".join(line for line in NCCL_TESTS.splitlines()[2:15]
                     if "Collective test" not in line)
    named = tmp_path / "all_reduce_perf_g2.txt"
    named.write_text(body)
    assert set(cf.read_collectives(named).op) == {cf.ALL_REDUCE}
    anonymous = tmp_path / "run.txt"
    anonymous.write_text(body)
    with pytest.raises(cf.CollectiveFormatError, match=r"run.txt, line \d+: a result row"):
        cf.read_collectives(anonymous)


def test_reads_csv_and_vidur_formats(tmp_path: Path) -> None:
    ours = tmp_path / "ours.csv"
    ours.write_text("# my cluster\ncollective,ranks,size_bytes,time_ms,host\n"
                    "all_reduce,4,1024,0.02,n1\nsend_recv,2,2048,0.01,n1\n")
    p = cf.read_collectives(ours)
    assert list(p.ranks) == [4, 2] and p.time_s == pytest.approx([2e-5, 1e-5])
    vidur = tmp_path / "vidur.csv"
    vidur.write_text(",time_stats.all_reduce.median,num_workers,size,collective,devices_per_node\n"
                     "0,0.05,2,2048,all_reduce,2\n1,0.5,2,2048,all_reduce,1\n")
    p = cf.read_collectives(vidur)
    assert len(p) == 1 and p.time_s[0] == pytest.approx(5e-5)
    assert "1 rows with ranks on several nodes" in p.note


@pytest.mark.parametrize(("text", "match"), [
    ("collective,ranks,size_bytes\nall_reduce,2,1024\n", r"line 1: no time column"),
    ("collective,size_bytes,time_us\nall_reduce,1024,3\n", r"line 1: missing column\(s\) ranks"),
    ("collective,ranks,size_bytes,time_us\nall_reduce,2,1024,fast\n",
     r"line 2, column time_us: 'fast' is not a number"),
    ("collective,ranks,size_bytes,time_us\n\nbroadcast,2,1024,3\n",
     r"line 3, column collective: collective 'broadcast'"),
    ("collective,ranks,size_bytes,time_us\nall_reduce,1,1024,3\n",
     r"line 2, column ranks: 1 must be an integer >= 2"),
    ("collective,ranks,size_bytes,time_us\nall_reduce,2,-5,3\n",
     r"line 2, column size_bytes: '-5' must be positive"),
])
def test_bad_csv_names_file_line_and_column(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(cf.CollectiveFormatError, match=r"bad.csv, " + match):
        cf.read_collectives(path)


# -- the analytic model charges the fitted collectives -------------------------------------------

@pytest.mark.parametrize(("name", "hw", "tp", "pp"),
                         [("llama-3-70b", "a100", 4, 1), ("opt-175b", "a100", 8, 1),
                          ("opt-175b", "a100", 2, 4), ("llama-3-70b", "h100", 2, 1),
                          ("opt-13b", "a100", 1, 2)])
def test_analytic_comm_is_the_fitted_collectives(name: str, hw: str, tp: int, pp: int) -> None:
    model, hardware = MODELS[name], HARDWARE[hw]
    cost = AnalyticCostModel(model, hardware, tp=tp, pp=pp)
    terms = builtin_collectives(hardware)
    msg = model.hidden_size * model.dtype_bytes
    for n in (1, 7, 512, 3000, 8192):  # 8192 x hidden is beyond the largest measured message
        shape = BatchShape(prefill_tokens=n)
        expected = (2 * model.num_layers * all_reduce_time(nearest_fit(terms, tp), tp, n * msg)
                    if tp > 1 else 0.0) + (pp - 1) * send_recv_time(terms.send_recv, n * msg)
        assert cost.breakdown(shape)["comm"] == pytest.approx(expected, rel=1e-9)
        assert sum(cost.breakdown(shape).values()) == pytest.approx(cost.iteration_time(shape),
                                                                    rel=1e-12)


def test_single_gpu_has_no_communication_terms() -> None:
    t = AnalyticCostModel(MODELS["opt-13b"], HARDWARE["a100"]).roofline_terms()
    assert (t.comm_tok_s, t.ar_tok_s, t.ar_floor_s, t.ar_startup_s) == (0.0, 0.0, 0.0, 0.0)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 20000), extra=st.integers(1, 5000))
def test_communication_never_decreases_with_the_tokens(n: int, extra: int) -> None:
    for tp in (2, 4, 8):
        t = AnalyticCostModel(MODELS["llama-3-70b"], HARDWARE["a100"], tp=tp).roofline_terms()
        assert roofline_time(t, n + extra, 1, 0.0, 0, 0) >= roofline_time(t, n, 1, 0.0, 0, 0)


def test_unmeasured_degrees_and_hardware() -> None:
    a100 = BUILTIN["a100"]
    assert nearest_fit(a100, 4).ranks == 4
    assert nearest_fit(a100, 16).ranks == 8
    assert nearest_fit(a100, 3).ranks == 4  # log-equidistant from 2 and 4: the larger
    cpu = builtin_collectives(HARDWARE["cpu"])
    scale = HARDWARE["cpu"].interconnect_bandwidth / HARDWARE["a100"].interconnect_bandwidth
    assert cpu.all_reduce[0].bus_bandwidth == pytest.approx(a100.all_reduce[0].bus_bandwidth
                                                            * scale)
    assert cpu.all_reduce[0].latency_s == a100.all_reduce[0].latency_s
    assert "assumption" in cpu.source


def test_deployment_collectives_are_used_and_validated() -> None:
    slow = CollectiveTerms(all_reduce=[AllReduceFit(ranks=4, latency_s=1e-3, startup_s=0.0,
                                                    bus_bandwidth=1e9, ref_bytes=1e6)],
                           send_recv=SendRecvFit(startup_s=0.0, bus_bandwidth=1e9))
    dep = Deployment(model="llama-3-70b", tp=4, kv_cache_gb=20.0)
    mine = dep.model_copy(update={"collectives": slow})
    one = BatchShape(prefill_tokens=1)
    extra = make_cost_model(mine).iteration_time(one) - make_cost_model(dep).iteration_time(one)
    assert extra > 2 * 80 * 1e-3 * 0.9  # 160 all-reduces at their 1 ms floor
    with pytest.raises(ValidationError, match="cost_model 'analytic' only"):
        Deployment(model="opt-13b", cost_model="profile", profile_csv="x.csv", collectives=slow)
    with pytest.raises(ValidationError, match="one fit per rank count"):
        CollectiveTerms(all_reduce=[slow.all_reduce[0]] * 2, send_recv=slow.send_recv)


# -- accelgen calibrate --collectives ------------------------------------------------------------

def _nccl_log(op: str, ranks: int, fit_time) -> str:
    devices = "\n".join(f"#  Rank {r:2d} Group  0 Pid 1 on n1 device {r:2d} [0x0{r}] NVIDIA A100"
                        for r in range(ranks))
    rows = "\n".join(f"{s:>12d} {s // 4:>12d} float sum -1 {fit_time(s) * 1e6:8.2f} 0 0 0 "
                     f"{fit_time(s) * 1e6:8.2f} 0 0 0" for s in (2 ** k for k in range(10, 28)))
    return (f"# Collective test starting: {op}_perf\n# Using devices\n{devices}\n#\n"
            f"#       size         count      type   redop    root     time\n{rows}\n")


def test_calibrate_collectives_writes_a_deployment(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from accelgen.cli import main

    true = AllReduceFit(ranks=4, latency_s=15e-6, startup_s=10e-6, bus_bandwidth=2.5e11,
                        exponent=0.9, ref_bytes=float(2 ** 27))
    log = tmp_path / "ar4.log"
    log.write_text(_nccl_log("all_reduce", 4, lambda s: all_reduce_time(true, 4, s)))
    out = tmp_path / "dep.yaml"
    rc = main(["calibrate", "--collectives", str(log), "--deployment", "llama-3-70b",
               "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "not fitted: send_recv: no points; kept DGX-A100" in text
    assert text.strip().splitlines()[-1].startswith(f"wrote {out} (llama-3-70b on 4 x a100")
    data = yaml.safe_load(out.read_text())
    dep = Deployment.model_validate(data["deployment"])
    assert dep.cost_model == "analytic" and dep.collectives is not None
    fit = dep.collectives.all_reduce[0]
    assert (fit.ranks, fit.exponent) == (4, pytest.approx(0.9, abs=0.02))
    assert fit.bus_bandwidth == pytest.approx(2.5e11, rel=0.03)
    assert dep.collectives.send_recv == BUILTIN["a100"].send_recv
    # The file is what `accelgen simulate --config` reads: its cost model charges the fit.
    cost = make_cost_model(dep)
    assert isinstance(cost, AnalyticCostModel) and cost.collectives == dep.collectives
    assert out.read_text().startswith("# Communication terms fitted by: accelgen calibrate")


def test_calibrate_collectives_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from accelgen.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_text("collective,ranks,size_bytes,time_us\nall_reduce,4,1024,x\n")
    out = tmp_path / "dep.yaml"
    assert main(["calibrate", "--collectives", str(bad), "--deployment", "llama-3-70b",
                 "--out", str(out)]) != 0
    assert "bad.csv, line 2, column time_us" in capsys.readouterr().err
    assert not out.exists()
    assert main(["calibrate", "--deployment", "llama-3-70b", "--out", str(out)]) != 0
    assert "--points" in capsys.readouterr().err and not out.exists()


def test_token_grid_spans_the_iteration() -> None:
    assert cf.TOKEN_GRID[0] == 1 and cf.TOKEN_GRID[-1] == 8192
    assert all(b > a for a, b in zip(cf.TOKEN_GRID, cf.TOKEN_GRID[1:], strict=False))
    assert math.isclose(cf.MATCH_FACTOR ** 2, 2.0)


def test_a_pipeline_deployment_takes_collectives() -> None:
    from accelgen.pipeline.config_file import DeploymentSpec, resolve_deployment_spec

    terms = BUILTIN["h100"].model_dump()
    dep = resolve_deployment_spec("llama-3-70b", DeploymentSpec.model_validate(
        {"collectives": terms}))
    assert dep.collectives == BUILTIN["h100"] and dep.tp == 4
