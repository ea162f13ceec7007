"""The results' lean paths give what the plain ones do: the requests table built from its token
times in one array (not through ``from_pandas``), a frame sharing a finished run's token times,
and the metrics' statistics taken on arrays they reorder."""

from __future__ import annotations

import io
import math
from array import array

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from accelgen import metrics
from accelgen.costmodel.datasheets import resolve_hardware, resolve_model
from accelgen.policies.registry import make_policy
from accelgen.results import REQUEST_COLUMNS, _float_lists, _table, requests_frame
from tests.conftest import make_requests, run_sim


def _frame(token_times: list[object]) -> pd.DataFrame:
    """A requests table with these ``token_times`` (the other columns filled alike)."""
    n = len(token_times)
    df = pd.DataFrame({c: np.arange(n, dtype=np.int64) for c in REQUEST_COLUMNS[:-1]})
    df["source"] = [f"s{i % 3}" for i in range(n)]
    df["status"] = "finished"
    df["online"] = [i % 2 == 0 for i in range(n)]
    df["arrival"] = np.linspace(0.0, 1.0, n)
    df["token_times"] = pd.Series(token_times, dtype=object)
    return df


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


_times = st.lists(st.one_of(st.floats(-1e9, 1e9), st.just(math.nan)), max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.lists(_times, min_size=1, max_size=8).filter(lambda ts: any(ts)))
def test_requests_table_is_the_from_pandas_table(times: list[list[float]]) -> None:
    """Token times as float64 arrays (``[]`` for none, NaN as null): the table and its file
    are ``from_pandas``'s, built from the values joined once."""
    df = _frame([np.array(t, dtype=np.float64) if t else [] for t in times])
    assert _float_lists(df["token_times"]) is not None  # the joined path is taken
    want = pa.Table.from_pandas(df, preserve_index=False)
    got = _table(df)
    assert got.equals(want, check_metadata=True)
    assert _parquet(got) == _parquet(want)


def test_other_token_columns_are_left_to_from_pandas() -> None:
    """No values at all (list<null>), Python lists, other dtypes: ``from_pandas`` decides."""
    for times in ([[], []], [[0.5, 1.0], []], [np.array([1, 2]), []],
                  [None, np.array([1.0])]):
        df = _frame(list(times))
        assert _float_lists(df["token_times"]) is None
        assert _table(df).equals(pa.Table.from_pandas(df, preserve_index=False),
                                 check_metadata=True)
    assert _table(_frame([]).iloc[:0]).num_rows == 0


def test_a_frame_sharing_token_times_is_the_copied_one() -> None:
    """``share_token_times``: each row views its request's array (no copy) and the table and
    file are those of the copied frame."""
    reqs = make_requests([(i * 0.05, 20 + 11 * (i % 5)) for i in range(30)])
    res = run_sim(reqs, [3 + i % 7 for i in range(30)], make_policy("vllm"), num_blocks=40)
    shared = requests_frame(res.requests, res.served_output_len, share_token_times=True)
    copied = requests_frame(res.requests, res.served_output_len)
    for r, times in zip(res.requests, shared["token_times"], strict=True):
        assert np.shares_memory(times, np.frombuffer(r.token_times, dtype=np.float64))
    assert _table(shared).equals(_table(copied), check_metadata=True)
    assert _parquet(_table(shared)) == _parquet(_table(copied))
    # A shared array cannot grow while the frame views it (why only finished runs share).
    grows = array("d", [1.0])
    view = requests_frame([_request_with(grows)], {0: 1}, share_token_times=True)
    try:
        grows.append(2.0)
        raise AssertionError("a shared array grew")
    except BufferError:
        pass
    del view


def _request_with(times: array[float]) -> object:
    r = make_requests([(0.0, 4)])[0]
    r.token_times = times
    return r


_INT_TYPES = st.sampled_from([np.int8, np.int16, np.int64])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**16), fs_type=_INT_TYPES,
       kv_type=_INT_TYPES, s_pf=st.integers(1, 300), no_blocks=st.booleans())
def test_utilisation_and_its_statistics_are_the_plain_expressions(
        n: int, seed: int, fs_type: type, kv_type: type, s_pf: int, no_blocks: bool) -> None:
    """Each utilisation column is the plain pandas expression's values (narrow integer columns
    too, no blocks at all as NaN); ``summarize`` takes their statistics on arrays it reorders,
    leaving the table as it was, and gets the statistics of the plain columns."""
    rng = np.random.default_rng(seed)
    its = pd.DataFrame({
        "start": np.arange(n) * 0.5, "latency": rng.uniform(1e-3, 0.2, n),
        "forward_size": rng.integers(1, 120, n).astype(fs_type),
        "prefill_attn": rng.integers(0, 10_000, n).astype(np.float64),
        "decode_ctx": rng.integers(0, 120, n).astype(fs_type),
        "kv_used_blocks": rng.integers(0, 100, n).astype(kv_type),
        "kv_total_blocks": np.full(n, 0 if no_blocks else 100, dtype=kv_type)})
    before = its.copy()
    model, hardware = resolve_model("opt-13b"), resolve_hardware("a100")
    dense = 2.0 * (model.num_params - model.vocab_size * model.hidden_size)
    attn = 4.0 * model.num_layers * model.hidden_size
    raw = its["forward_size"] / s_pf
    kv_util = its["kv_used_blocks"] / its["kv_total_blocks"]
    want = {"gpu_util_raw": raw, "gpu_util": raw.clip(upper=1.0), "kv_util": kv_util,
            "kv_unallocated": 1.0 - kv_util,
            "mfu": ((its["prefill_attn"] + its["decode_ctx"]) * attn + its["forward_size"] * dense)
            / (its["latency"] * (hardware.peak_flops * 2))}
    got = metrics.iteration_metrics(its, s_pf, model, hardware, num_gpus=2)
    summary = metrics.summarize(_frame([np.array([0.0, 1.0])]), its, s_pf=s_pf, model=model,
                                hardware=hardware, num_gpus=2)
    pd.testing.assert_frame_equal(its, before)
    for name, values in want.items():
        plain = values.to_numpy(np.float64)
        assert np.array_equal(got[name].to_numpy(), plain, equal_nan=True), name
        for key, value in metrics._stats(plain, name).items():
            assert summary[key] == value or (math.isnan(value) and math.isnan(summary[key])), key


def test_tbt_samples_are_each_requests_gaps_in_order() -> None:
    times = [np.array([0.0, 0.5, 0.75]), [], np.array([2.0]), [1.0, 1.5], np.array([3.0, 2.0])]
    want = np.concatenate([np.diff(np.asarray(t, dtype=np.float64)) for t in times if len(t) > 1])
    got = metrics.tbt_samples(_frame(times))
    assert got.dtype == np.float64 and np.array_equal(got, want)
    assert metrics.tbt_samples(_frame([[], np.array([1.0])])).size == 0
